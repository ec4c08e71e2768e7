// `qinfer bench -m MODEL [-p 512] [-n 128] [-r 5] [-t N] [-ngl N] [--depth D] [-np B] [-o md|json|csv]`
// Prompt processing (ppP) and generation (tgN) throughput in llama-bench's
// table layout: mean ± standard deviation over the repetitions, after one
// unmeasured warm-up run. -p/-n/-t/-ngl/--depth/-np take comma lists; every
// combination is measured. Random token ids: no tokenizer involved.
//
// -np B > 1 adds batched generation ("tgN xB"): B sequences decode N tokens
// each, one forward pass per step with one token of every sequence (what a
// server does under load); t/s is the aggregate over all B sequences.
//
// Decode at batch 1 reads every weight once per token, so for CPU runs the
// command also measures this machine's read bandwidth with the same thread
// count and reports, per tg test, the weight bytes a token reads, the decode
// bytes/s that implies and its fraction of the measured bandwidth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/env.h"
#include "common/error.h"
#include "common/platform.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

namespace qinfer::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> parse_int_list(const std::string& s, const char* flag, int min_value) {
    std::vector<int> out;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        const std::string tok = s.substr(i, j - i);
        char* end = nullptr;
        const long v = std::strtol(tok.c_str(), &end, 10);
        if (tok.empty() || !end || *end || v < min_value || v > 1000000)
            fail(strfmt("%s: '%s' is not a valid value (integer >= %d)", flag, tok.c_str(), min_value));
        out.push_back(int(v));
        i = j + 1;
    }
    return out;
}

struct Stats {
    double mean = 0, stddev = 0;
};

Stats stats(const std::vector<double>& v) {
    Stats s;
    if (v.empty()) return s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    if (v.size() > 1) {
        double ss = 0;
        for (double x : v) ss += (x - s.mean) * (x - s.mean);
        s.stddev = std::sqrt(ss / double(v.size() - 1));
    }
    return s;
}

struct Row {
    std::string model, size, params, backend;
    std::string placement;  // Model::backend_description()
    int threads = 0, ngl = 0, n_prompt = 0, n_gen = 0, depth = 0, parallel = 1;
    uint64_t file_bytes = 0, n_params = 0;
    std::vector<double> tps;      // per repetition
    std::vector<double> ttft_ms;  // pp tests: prompt + first-token sampling
    uint64_t decode_bytes = 0;    // weight bytes one decode step reads
    double mem_bw_gbs = 0;        // measured read bandwidth (CPU runs; 0 = not measured)
    bool is_tg() const { return n_prompt == 0 && n_gen > 0; }
    // Weight bytes per second: a batched step reads the weights once for all its sequences.
    double decode_gbs() const {
        return is_tg() ? stats(tps).mean / double(parallel) * double(decode_bytes) / 1e9 : 0.0;
    }
    double bw_fraction() const { return mem_bw_gbs > 0 ? decode_gbs() / mem_bw_gbs : 0.0; }
    std::string test() const {
        std::string t = n_prompt > 0 ? strfmt("pp%d", n_prompt) : strfmt("tg%d", n_gen);
        if (parallel > 1) t += strfmt(" x%d", parallel);
        if (depth > 0) t += strfmt(" @ d%d", depth);
        return t;
    }
};

// Bytes of weights one decode step reads: every tensor of the main layers
// (MTP layers never run), the output norm and head, and one row of the token
// embedding (all of it when the head is tied to it). KV-cache reads are not
// counted: they are small next to the weights at the depths measured here.
uint64_t decode_weight_bytes(const Model& model) {
    const gguf::File& f = model.file();
    const int64_t n_layer = model.hparams().n_layer;
    const bool tied = f.find_tensor("output.weight") == nullptr;
    uint64_t total = 0;
    for (const gguf::TensorInfo& t : f.tensors()) {
        if (t.name.rfind("blk.", 0) == 0) {
            if (std::strtol(t.name.c_str() + 4, nullptr, 10) < n_layer) total += t.nbytes;
        } else if (t.name == "token_embd.weight" && !tied) {
            total += t.rows() > 0 ? t.nbytes / uint64_t(t.rows()) : 0;
        } else {
            total += t.nbytes;
        }
    }
    return total;
}

// Read bandwidth with `threads` threads, in GB/s (1e9 bytes/s): every thread
// sums its own contiguous slice of a 1 GiB buffer (far larger than any
// last-level cache, so it streams from memory); best of several passes, as
// STREAM reports. Pages are first touched by the thread that normally reads
// them. The command probes before and after each thread count's tests.
double measure_read_bandwidth(int threads) {
    constexpr size_t kBytes = size_t(1) << 30, kWords = kBytes / 8;
    std::unique_ptr<uint64_t[]> buf(new uint64_t[kWords]);
    ThreadPool pool(threads);
    auto slice = [](int id, int nt, size_t& a, size_t& b) {
        a = kWords * size_t(id) / size_t(nt);
        b = kWords * size_t(id + 1) / size_t(nt);
    };
    pool.run_on_all([&](int id, int nt) {
        size_t a, b;
        slice(id, nt, a, b);
        for (size_t i = a; i < b; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
    });
    std::vector<uint64_t> sums(size_t(threads) * 8);  // one cache line per thread
    double best = 0;
    for (int pass = 0; pass < 6; ++pass) {
        const auto t0 = Clock::now();
        pool.run_on_all([&](int id, int nt) {
            size_t a, b;
            slice(id, nt, a, b);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // independent chains: loads, not adds, bound the loop
            size_t i = a;
            for (; i + 4 <= b; i += 4) {
                s0 += buf[i];
                s1 += buf[i + 1];
                s2 += buf[i + 2];
                s3 += buf[i + 3];
            }
            for (; i < b; ++i) s0 += buf[i];
            sums[size_t(id) * 8] = s0 + s1 + s2 + s3;
        });
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (pass > 0) best = std::max(best, double(kBytes) / sec / 1e9);  // pass 0 warms the TLB
    }
    uint64_t all = 0;
    for (uint64_t v : sums) all += v;
    if (all == 1) std::fprintf(stderr, " ");  // keeps the sums (and the reads) alive
    return best;
}

std::string human_size(uint64_t bytes) {
    const double gib = double(bytes) / (1024.0 * 1024.0 * 1024.0);
    if (gib >= 1.0) return strfmt("%.2f GiB", gib);
    return strfmt("%.2f MiB", double(bytes) / (1024.0 * 1024.0));
}

std::string human_params(uint64_t n) {
    if (n >= 1000000000ull) return strfmt("%.2f B", double(n) / 1e9);
    if (n >= 1000000ull) return strfmt("%.2f M", double(n) / 1e6);
    return strfmt("%.2f K", double(n) / 1e3);
}

// Fills the slot with `n` random tokens (context for a depth test), unmeasured.
// The last token asks for its logits, so the call returns only once the
// device has processed the whole fill: a GPU backend queues work, and the
// measured part must not start while the fill's last chunks still run.
void fill(Model& model, Rng& rng, int n_vocab, int n, int n_batch, int slot) {
    Batch b;
    std::vector<float> logits;
    for (int done = 0; done < n;) {
        b.clear();
        const int k = std::min(n_batch, n - done);
        for (int i = 0; i < k; i++)
            b.add(int32_t(rng.next() % uint64_t(n_vocab)), done + i, slot, done + i + 1 == n);
        model.forward(b, logits);
        done += k;
    }
}

// One repetition; returns tokens/s and (pp) the time to first token.
std::pair<double, double> run_once(Model& model, Rng& rng, int n_vocab, const Row& row, int n_batch) {
    const int B = row.parallel;
    for (int s = 0; s < B; s++) {
        model.clear_slot(s);
        fill(model, rng, n_vocab, row.depth, n_batch, s);
    }
    std::vector<float> logits;
    Batch b;
    const auto t0 = Clock::now();
    if (row.n_prompt > 0) {
        for (int done = 0; done < row.n_prompt;) {
            b.clear();
            const int k = std::min(n_batch, row.n_prompt - done);
            for (int i = 0; i < k; i++)
                b.add(int32_t(rng.next() % uint64_t(n_vocab)), row.depth + done + i, 0, done + i + 1 == row.n_prompt);
            model.forward(b, logits);
            done += k;
        }
        const int32_t first = argmax(logits.data(), n_vocab);
        (void)first;
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        return {1000.0 * row.n_prompt / ms, ms};
    }
    // Greedy decoding, as `qinfer run --temp 0` does it: the backend picks the
    // next token of each sequence, and each step is queued while the one
    // before it runs, fed that step's picks on the device (Model::submit_argmax;
    // QINFER_DECODE_PIPELINE=0: one Model::forward_argmax at a time).
    static const bool pipelined = env_int("QINFER_DECODE_PIPELINE", 0, 1, 1) != 0;
    std::vector<int32_t> tok(static_cast<size_t>(B));
    for (int32_t& t : tok) t = int32_t(rng.next() % uint64_t(n_vocab));
    for (int i = 0; i < row.n_gen; i++) {
        b.clear();
        for (int s = 0; s < B; s++) b.add(pipelined && i > 0 ? 0 : tok[size_t(s)], row.depth + i, s, true);
        if (!pipelined) {
            model.forward_argmax(b, tok);
            continue;
        }
        model.submit_argmax(b, i > 0);
        if (model.uncollected() == Model::kMaxSubmitted) model.collect_argmax(tok);
    }
    while (model.uncollected() > 0) model.collect_argmax(tok);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return {1000.0 * row.n_gen * B / ms, 0.0};
}

void print_markdown(const std::vector<Row>& rows) {
    std::printf("| %-30s | %10s | %10s | %-16s | %7s | %13s | %20s |\n", "model", "size", "params", "backend", "threads",
                "test", "t/s");
    std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(30, '-').c_str(), std::string(9, '-').c_str(),
                std::string(9, '-').c_str(), std::string(16, '-').c_str(), std::string(6, '-').c_str(),
                std::string(12, '-').c_str(), std::string(19, '-').c_str());
    for (const Row& r : rows) {
        const Stats s = stats(r.tps);
        // printf pads bytes; "±" is two bytes but one column.
        std::string tps = strfmt("%.2f ± %.2f", s.mean, s.stddev);
        tps.insert(0, size_t(std::max(0, 21 - int(tps.size()))), ' ');
        std::printf("| %-30s | %10s | %10s | %-16s | %7d | %13s | %s |\n", r.model.c_str(), r.size.c_str(),
                    r.params.c_str(), r.backend.c_str(), r.threads, r.test().c_str(), tps.c_str());
    }
    for (const Row& r : rows) {
        if (r.ttft_ms.empty()) continue;
        const Stats s = stats(r.ttft_ms);
        std::printf("\nTTFT %s (threads %d, ngl %d): %.2f ± %.2f ms", r.test().c_str(), r.threads, r.ngl, s.mean,
                    s.stddev);
    }
    std::printf("\n");
    std::string last_placement;
    for (const Row& r : rows) {
        if (r.placement == last_placement) continue;
        std::printf("placement (ngl %d, threads %d): %s\n", r.ngl, r.threads, r.placement.c_str());
        last_placement = r.placement;
    }
    int last_bw_threads = -1;
    for (const Row& r : rows) {
        if (!r.is_tg() || r.mem_bw_gbs <= 0) continue;
        if (r.threads != last_bw_threads)
            std::printf("\nmemory read bandwidth (threads %d): %.2f GB/s\n", r.threads, r.mem_bw_gbs);
        last_bw_threads = r.threads;
        std::printf("%s (threads %d): %.1f MB weights/token, decode %.2f GB/s = %.1f%% of the measured bandwidth\n",
                    r.test().c_str(), r.threads, double(r.decode_bytes) / 1e6, r.decode_gbs(),
                    100.0 * r.bw_fraction());
    }
}

void print_json(const std::vector<Row>& rows) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
        const Stats s = stats(r.tps);
        nlohmann::ordered_json j;
        j["model_type"] = r.model;
        j["model_size"] = r.file_bytes;
        j["model_n_params"] = r.n_params;
        j["backends"] = r.backend;
        j["placement"] = r.placement;
        j["n_threads"] = r.threads;
        j["n_gpu_layers"] = r.ngl;
        j["n_prompt"] = r.n_prompt;
        j["n_gen"] = r.n_gen;
        j["n_depth"] = r.depth;
        j["n_parallel"] = r.parallel;
        j["test"] = r.test();
        j["avg_ts"] = s.mean;
        j["stddev_ts"] = s.stddev;
        j["samples_ts"] = r.tps;
        if (!r.ttft_ms.empty()) {
            const Stats t = stats(r.ttft_ms);
            j["avg_ttft_ms"] = t.mean;
            j["stddev_ttft_ms"] = t.stddev;
        }
        if (r.is_tg()) {
            j["decode_bytes_per_token"] = r.decode_bytes;
            j["decode_gbs"] = r.decode_gbs();
            if (r.mem_bw_gbs > 0) {
                j["mem_bw_gbs"] = r.mem_bw_gbs;
                j["bw_fraction"] = r.bw_fraction();
            }
        }
        arr.push_back(j);
    }
    std::printf("%s\n", arr.dump(2).c_str());
}

void print_csv(const std::vector<Row>& rows) {
    // Bandwidth columns are 0 where they do not apply (pp tests, GPU runs).
    std::printf("model_type,model_size,model_n_params,backends,n_threads,n_gpu_layers,n_prompt,n_gen,n_depth,avg_ts,"
                "stddev_ts,decode_bytes_per_token,decode_gbs,mem_bw_gbs,bw_fraction\n");
    for (const Row& r : rows) {
        const Stats s = stats(r.tps);
        std::printf("\"%s\",%llu,%llu,\"%s\",%d,%d,%d,%d,%d,%.6f,%.6f,%llu,%.6f,%.6f,%.6f\n", r.model.c_str(),
                    (unsigned long long)r.file_bytes, (unsigned long long)r.n_params, r.backend.c_str(), r.threads,
                    r.ngl, r.n_prompt, r.n_gen, r.depth, s.mean, s.stddev,
                    (unsigned long long)(r.is_tg() ? r.decode_bytes : 0), r.decode_gbs(), r.is_tg() ? r.mem_bw_gbs : 0.0,
                    r.bw_fraction());
    }
}

}  // namespace

int cmd_bench(int argc, char** argv) {
    CLI::App app{"Prompt processing / generation throughput (llama-bench layout)", "qinfer bench"};
    std::string model_path, p_str = "512", n_str = "128", t_str, ngl_str = "0", d_str = "0", np_str = "1", out = "md";
    int reps = 5, n_batch = 0, op_offload_min_batch = kOpOffloadMinBatch;
    std::string kv_type = "f16", kv_type_v;
    app.add_option("-m,--model", model_path, "GGUF model file")->required();
    app.add_option("-p,--n-prompt", p_str, "prompt lengths (comma list; 0 = skip pp)");
    app.add_option("-n,--n-gen", n_str, "generation lengths (comma list; 0 = skip tg)");
    app.add_option("-t,--threads", t_str, "CPU threads (comma list; default physical cores)");
    app.add_option("--gpu-layers,--n-gpu-layers", ngl_str, "GPU layers (-ngl; comma list)");
    app.add_option("-d,--depth", d_str, "tokens already in the context (comma list)");
    app.add_option("--parallel", np_str, "sequences decoding together (-np; comma list): batched tg tests");
    app.add_option("-r,--repetitions", reps, "measured repetitions per test")->check(CLI::Range(1, 1000));
    app.add_option("-b,--batch-size", n_batch,
                   "max tokens per forward pass (default: 2048 with the whole model on the GPU, else 512, as run)")
        ->check(CLI::Range(1, 65536));
    add_op_offload_flags(app, op_offload_min_batch);
    add_kv_type_flags(app, kv_type, kv_type_v);
    app.add_option("-o,--output", out, "output format: md, json or csv")->check(CLI::IsMember({"md", "json", "csv"}));
    if (const int rc = parse_llama_style(app, argc, argv); rc >= 0) return rc;
    const std::vector<int> ps = parse_int_list(p_str, "-p", 0), ns = parse_int_list(n_str, "-n", 0);
    std::vector<int> ngls;  // N, all or auto per item
    for (size_t i = 0; i <= ngl_str.size();) {
        size_t j = ngl_str.find(',', i);
        if (j == std::string::npos) j = ngl_str.size();
        ngls.push_back(parse_gpu_layers(ngl_str.substr(i, j - i)));
        i = j + 1;
    }
    const std::vector<int> depths = parse_int_list(d_str, "--depth", 0);
    const std::vector<int> nps = parse_int_list(np_str, "-np", 1);
    const int max_np = *std::max_element(nps.begin(), nps.end());
    const std::vector<int> ts = t_str.empty() ? std::vector<int>{physical_cores()} : parse_int_list(t_str, "-t", 1);

    int max_ctx = 0;
    for (int d : depths)
        for (int p : ps)
            for (int n : ns) max_ctx = std::max({max_ctx, d + p, d + n});
    if (max_ctx == 0) fail("nothing to measure: all -p and -n values are 0");

    bool any_tg = false;
    for (int n : ns) any_tg |= n > 0;
    std::map<int, double> bandwidth;  // per thread count, measured once

    std::vector<Row> rows;
    Rng rng(1234);
    for (int ngl : ngls) {
        for (int threads : ts) {
            EngineOptions eo;
            eo.n_ctx = max_ctx + 1;
            eo.n_slots = max_np;
            eo.n_batch = n_batch;
            eo.n_threads = threads;
            eo.gpu_layers = ngl;
            eo.kv_type = kv_type_from_flags(kv_type, kv_type_v);
            eo.op_offload_min_batch = op_offload_min_batch;
            auto engine = Engine::load(model_path, eo);
            const ModelInfo info = engine->info();
            Model& model = engine->model();
            const int n_vocab = info.n_vocab;
            const std::string size_label(model.file().get_string("general.size_label").value_or("?B"));
            // Layers on the CPU only (prompt offload may still run prompts on the GPU).
            const bool on_cpu = model.layers_on_host();
            const uint64_t decode_bytes = decode_weight_bytes(model);
            if (on_cpu && any_tg && !bandwidth.count(threads)) bandwidth[threads] = measure_read_bandwidth(threads);
            std::vector<Row> tests;
            for (int d : depths) {
                for (int p : ps) {
                    if (p <= 0) continue;
                    tests.emplace_back();
                    tests.back().n_prompt = p;
                    tests.back().depth = d;
                }
                for (int n : ns) {
                    if (n <= 0) continue;
                    for (int np : nps) {
                        tests.emplace_back();
                        tests.back().n_gen = n;
                        tests.back().depth = d;
                        tests.back().parallel = np;
                    }
                }
            }
            for (Row& r : tests) {
                r.model = info.arch + " " + size_label + " " + info.file_type;
                r.size = human_size(info.file_bytes);
                r.params = human_params(info.n_params);
                r.backend = !on_cpu ? "CUDA" : model.offloads_prompts() ? "CPU+GPU prompts" : "CPU";
                r.placement = info.backend + strfmt(", batch %d", model.options().n_batch);
                r.decode_bytes = decode_bytes;
                r.mem_bw_gbs = on_cpu && r.is_tg() ? bandwidth[threads] : 0.0;
                r.threads = threads;
                r.ngl = ngl;
                r.file_bytes = info.file_bytes;
                r.n_params = info.n_params;
                run_once(model, rng, n_vocab, r, model.options().n_batch);  // warm-up
                for (int i = 0; i < reps; i++) {
                    auto [tps, ttft] = run_once(model, rng, n_vocab, r, model.options().n_batch);
                    r.tps.push_back(tps);
                    if (r.n_prompt > 0) r.ttft_ms.push_back(ttft);
                }
                rows.push_back(r);
            }
            for (int s = 0; s < max_np; s++) model.clear_slot(s);
            // Again after the tests, keeping the best: on a shared machine one
            // probe can land in another job's burst of memory traffic.
            if (on_cpu && any_tg) bandwidth[threads] = std::max(bandwidth[threads], measure_read_bandwidth(threads));
        }
    }
    for (Row& r : rows)
        if (r.mem_bw_gbs > 0) r.mem_bw_gbs = bandwidth[r.threads];
    if (out == "json")
        print_json(rows);
    else if (out == "csv")
        print_csv(rows);
    else
        print_markdown(rows);
    return 0;
}

}  // namespace qinfer::cli
