#include "convert/convert.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "common/platform.h"
#include "common/thread_pool.h"
#include "convert/encode.h"
#include "convert/gguf_meta.h"
#include "convert/hf_config.h"
#include "convert/hf_vocab.h"
#include "convert/safetensors.h"
#include "convert/tensor_map.h"
#include "gguf/writer.h"

namespace qinfer::convert {

GgmlType parse_outtype(const std::string& s) {
    std::string l = s;
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (l == "f32") return GgmlType::F32;
    if (l == "f16") return GgmlType::F16;
    if (l == "bf16") return GgmlType::BF16;
    if (l == "q8_0") return GgmlType::Q8_0;
    fail("convert: --outtype '" + s + "' is not supported (f32, f16, bf16, q8_0; use `qinfer quantize` for others)");
}

ConvertResult convert_hf(const std::string& dir, const std::string& out_path, const ConvertOptions& opt) {
    auto log = [&](const std::string& m) {
        if (opt.log) opt.log(m);
    };
    const GgmlType ot = opt.outtype;
    if (ot != GgmlType::F32 && ot != GgmlType::F16 && ot != GgmlType::BF16 && ot != GgmlType::Q8_0)
        fail(strfmt("convert: output type %s is not supported (f32, f16, bf16, q8_0)", type_name(ot)));

    HfConfig cfg = read_hf_config(dir);
    auto ck = Checkpoint::open_dir(dir);
    TensorPlan plan = plan_tensors(cfg, *ck);
    // Embedding rows decide the vocabulary size the tokenizer is padded to.
    VocabInputs vin;
    vin.pre = cfg.arch == Arch::Qwen35 ? "qwen35" : "qwen2";
    vin.pad_to = cfg.vocab_size;
    vin.bos_id = cfg.bos_id;
    vin.eos_id = cfg.eos_id;
    vin.pad_id = cfg.pad_id;
    GgufVocab vocab = read_hf_vocab(dir, vin);

    gguf::Writer w;
    write_hparams(w, cfg, file_type_of(ot));
    write_vocab(w, vocab);

    ConvertResult res;
    res.arch = arch_name(cfg.arch);
    res.notes = plan.notes;
    ThreadPool pool(opt.n_threads > 0 ? opt.n_threads : physical_cores());
    ThreadPool* pp = &pool;
    bool any_quant = false;
    for (const PlannedTensor& t : plan.tensors) {
        GgmlType type = t.keep_f32 || t.ne.size() < 2 ? GgmlType::F32 : ot;
        // Q8_0 needs rows that are whole 32-element blocks; fall back like llama.cpp.
        if (type == GgmlType::Q8_0 && t.ne[0] % 32 != 0) {
            type = GgmlType::F16;
            res.notes.push_back(strfmt("%s: %lld columns are not a multiple of 32; written as F16", t.name.c_str(),
                                       (long long)t.ne[0]));
        }
        any_quant = any_quant || is_quantized(type);
        const PlannedTensor* tp = &t;
        w.add_tensor(t.name, type, std::span<const int64_t>(t.ne), [tp, type, pp](const gguf::ByteSink& sink) {
            stream_rows(sink, type, tp->ne[0], tp->rows(),
                        [tp](int64_t r0, int64_t n, float* dst) { tp->read_rows(r0, n, dst); }, pp);
        });
    }
    if (any_quant) w.set_u32("general.quantization_version", 2);
    res.n_tensors = plan.tensors.size();
    res.file_bytes = w.file_size();
    for (const std::string& n : res.notes) log("note: " + n);
    log(strfmt("writing %s: %s, %zu tensors, %s weights, %.1f MB", out_path.c_str(), res.arch.c_str(), res.n_tensors,
               type_name(ot), double(res.file_bytes) / 1e6));
    w.write(out_path);
    return res;
}

}  // namespace qinfer::convert
