// Tokenizer throughput (results in bench/results/tokenizer.md).
//   BM_EncodeMixed1MB      1 MiB of generated English prose, Chinese prose and
//                          code (C++/Python), encoded on one thread.
//   BM_EncodeMixed1MBCold  the same with an empty piece cache every iteration.
//   BM_EncodeNoSpaces1MB   1 MiB of Chinese without spaces or punctuation: a
//                          single pre-tokenizer piece (the long-piece BPE path).
//   BM_EncodeChatPrompt    a short chat-template prompt with special tokens.
//   BM_Decode1MB           ids of the mixed text back to bytes.
//   BM_LoadVocab           Tokenizer construction from an opened GGUF file.
// The vocabulary is the reference vocab-qwen3.gguf (151936 tokens, 151387 merges).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

namespace {

const char* const kEnglish[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he",
    "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
    "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
    "no", "model", "token", "memory", "server", "request", "latency", "throughput", "kernel", "matrix", "vector",
    "attention", "layer", "cache", "context", "prompt", "answer", "question", "language", "system", "engine",
    "performance", "measurement", "experiment", "result", "analysis", "history", "government", "university",
    "information", "development", "international", "environment", "technology", "community", "relationship",
    "understanding", "particularly", "significant", "approximately", "nevertheless", "configuration", "quantization",
    "inference", "benchmark", "accelerator", "distributed", "scheduler", "allocation", "precision", "gradient",
    "weather", "city", "river", "mountain", "morning", "evening", "family", "friend", "market", "price", "people",
    "world", "time", "year", "day", "way", "thing", "man", "woman", "child", "life", "hand", "part", "place", "case",
    "week", "company", "number", "group", "problem", "fact", "don't", "it's", "we're", "they'll", "I'm", "Qwen",
    "GPU", "CUDA", "API", "JSON", "HTTP", "Linux", "Python", "GitHub",
};
const char* const kChinese[] = {
    "我们", "你们", "他们", "今天", "明天", "昨天", "时候", "问题", "模型", "语言", "推理", "引擎", "内存", "显存",
    "速度", "性能", "测试", "结果", "数据", "分析", "系统", "服务", "请求", "用户", "助手", "回答", "思考", "学习",
    "中国", "北京", "上海", "城市", "天气", "很好", "非常", "可以", "需要", "已经", "因为", "所以", "但是", "如果",
    "这个", "那个", "什么", "怎么", "为什么", "研究", "发展", "经济", "社会", "文化", "历史", "科学", "技术", "计算",
    "矩阵", "向量", "注意力", "缓存", "上下文", "长度", "量化", "精度", "训练", "部署", "开源", "社区", "文档",
    "敏捷", "棕色", "狐狸", "跳过", "懒狗", "自然", "处理", "人工智能", "机器", "网络", "图像", "声音", "文本",
    "的", "了", "是", "在", "和", "有", "也", "就", "都", "而", "及", "与", "着", "或", "一个", "没有", "我们的",
};
const char* const kIdent[] = {"get", "set", "token", "count", "buffer", "size", "index", "value", "result", "node",
                              "tree", "key", "cache", "batch", "layer", "weight", "scale", "row", "col", "data",
                              "state", "config", "path", "file", "name", "item", "list", "map", "len", "tmp"};
const char* const kOps[] = {" = ", " + ", " - ", " * ", " / ", " == ", " != ", " < ", " >= ", " && ", " || ",
                            " -> ", " += ", " << "};

std::string ident(std::mt19937& rng) {
    std::string s = kIdent[rng() % 30];
    int style = int(rng() % 3);
    if (style == 1) {
        std::string part = kIdent[rng() % 30];
        part[0] = char(part[0] - 32);
        s += part;
    } else if (style == 2) {
        s += "_";
        s += kIdent[rng() % 30];
    }
    return s;
}

std::string english_paragraph(std::mt19937& rng) {
    std::string p;
    for (int s = 0, n = 3 + int(rng() % 5); s < n; ++s) {
        std::string sentence;
        for (int w = 0, m = 8 + int(rng() % 14); w < m; ++w) {
            if (w) sentence += (rng() % 12 == 0) ? ", " : " ";
            if (rng() % 25 == 0)
                sentence += std::to_string(rng() % 100000);
            else
                sentence += kEnglish[rng() % (sizeof kEnglish / sizeof *kEnglish)];
        }
        sentence[0] = char(std::toupper(static_cast<unsigned char>(sentence[0])));
        p += sentence + (rng() % 6 == 0 ? "? " : ". ");
    }
    return p + "\n\n";
}

std::string chinese_paragraph(std::mt19937& rng) {
    std::string p;
    for (int s = 0, n = 2 + int(rng() % 4); s < n; ++s) {
        for (int w = 0, m = 10 + int(rng() % 20); w < m; ++w) {
            if (w && rng() % 9 == 0) p += "，";
            if (rng() % 30 == 0)
                p += std::string(" ") + kEnglish[rng() % (sizeof kEnglish / sizeof *kEnglish)] + " ";
            else
                p += kChinese[rng() % (sizeof kChinese / sizeof *kChinese)];
        }
        p += (rng() % 5 == 0) ? "！" : "。";
    }
    return p + "\n\n";
}

std::string code_block(std::mt19937& rng) {
    std::string c;
    const bool py = rng() % 2;
    if (py) {
        c += "def " + ident(rng) + "(" + ident(rng) + ", " + ident(rng) + "=None):\n";
        for (int i = 0, n = 3 + int(rng() % 8); i < n; ++i) {
            c += std::string(4 * (1 + rng() % 2), ' ');
            switch (rng() % 4) {
                case 0: c += ident(rng) + kOps[rng() % 14] + ident(rng) + "[" + std::to_string(rng() % 64) + "]\n"; break;
                case 1: c += "if " + ident(rng) + " is not None:\n"; break;
                case 2: c += "# " + std::string(kEnglish[rng() % 60]) + " " + kEnglish[rng() % 60] + "\n"; break;
                default: c += "return " + ident(rng) + "(" + ident(rng) + ", \"" + ident(rng) + "\")\n";
            }
        }
    } else {
        c += "static int " + ident(rng) + "(const std::vector<int>& " + ident(rng) + ") {\n";
        for (int i = 0, n = 3 + int(rng() % 8); i < n; ++i) {
            c += std::string(4 * (1 + rng() % 2), ' ');
            switch (rng() % 4) {
                case 0: c += "auto " + ident(rng) + kOps[rng() % 14] + ident(rng) + "->" + ident(rng) + "();\n"; break;
                case 1: c += "for (size_t i = 0; i < " + ident(rng) + ".size(); ++i) {\n"; break;
                case 2: c += "// " + std::string(kEnglish[rng() % 60]) + " " + kEnglish[rng() % 60] + "\n"; break;
                default: c += "printf(\"%d\\n\", " + ident(rng) + "[" + std::to_string(rng() % 1024) + "]);\n";
            }
        }
        c += "}\n";
    }
    return c + "\n";
}

const std::string& mixed_text() {
    static const std::string text = [] {
        std::mt19937 rng(42);
        std::string t;
        while (t.size() < (1u << 20)) {
            unsigned k = rng() % 10;
            t += k < 4 ? english_paragraph(rng) : k < 7 ? chinese_paragraph(rng) : code_block(rng);
        }
        t.resize(1u << 20);  // may cut a character: the tokenizer takes any bytes
        return t;
    }();
    return text;
}

struct Fixture {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<Tokenizer> tok;
};

Fixture& fixture() {
    static Fixture f = [] {
        Fixture x;
        const char* dir = std::getenv("QINFER_REFERENCE_DIR");  // override for another machine
        x.file = gguf::File::open(std::string(dir ? dir : QINFER_REFERENCE_DIR) + "/vocab-qwen3.gguf");
        x.tok = std::make_unique<Tokenizer>(*x.file);
        return x;
    }();
    return f;
}

void BM_EncodeMixed1MB(benchmark::State& state) {
    const Tokenizer& tok = *fixture().tok;
    const std::string& text = mixed_text();
    size_t n_ids = 0;
    for (auto _ : state) {
        auto ids = tok.encode(text);
        n_ids = ids.size();
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
    state.counters["tokens"] = double(n_ids);
}
BENCHMARK(BM_EncodeMixed1MB)->Unit(benchmark::kMillisecond);

void BM_EncodeMixed1MBCold(benchmark::State& state) {
    const std::string& text = mixed_text();
    for (auto _ : state) {
        state.PauseTiming();
        auto tok = std::make_unique<Tokenizer>(*fixture().file);
        state.ResumeTiming();
        auto ids = tok->encode(text);
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_EncodeMixed1MBCold)->Unit(benchmark::kMillisecond);

void BM_EncodeNoSpaces1MB(benchmark::State& state) {
    const Tokenizer& tok = *fixture().tok;
    std::mt19937 rng(1);
    std::string text;
    while (text.size() < (1u << 20)) text += kChinese[rng() % 80];
    for (auto _ : state) {
        auto ids = tok.encode(text);
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_EncodeNoSpaces1MB)->Unit(benchmark::kMillisecond);

void BM_EncodeChatPrompt(benchmark::State& state) {
    const Tokenizer& tok = *fixture().tok;
    const std::string prompt =
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "请用三句话解释一下什么是 KV cache，并给出一个 Python 例子。<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    for (auto _ : state) {
        auto ids = tok.encode(prompt);
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(prompt.size()));
}
BENCHMARK(BM_EncodeChatPrompt)->Unit(benchmark::kMicrosecond);

void BM_Decode1MB(benchmark::State& state) {
    const Tokenizer& tok = *fixture().tok;
    const auto ids = tok.encode(mixed_text());
    for (auto _ : state) {
        std::string s = tok.decode(ids);
        benchmark::DoNotOptimize(s.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(mixed_text().size()));
}
BENCHMARK(BM_Decode1MB)->Unit(benchmark::kMillisecond);

void BM_LoadVocab(benchmark::State& state) {
    const gguf::File& file = *fixture().file;
    for (auto _ : state) {
        Tokenizer tok(file);
        benchmark::DoNotOptimize(&tok);
    }
}
BENCHMARK(BM_LoadVocab)->Unit(benchmark::kMillisecond);

}  // namespace
