// `qinfer logits -m MODEL --ids 1,2,3 --out FILE`: runs the ids as one prompt
// batch and writes float32 little-endian logits [n_ids][n_vocab], one row per
// position (row i = distribution after ids[0..i]). For comparing against
// reference logits.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/error.h"
#include "model/model.h"
#include "common/platform.h"

namespace qinfer::cli {

namespace {
std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find_first_of(", ", i);
        if (j == std::string::npos) j = s.size();
        if (j > i) {
            const std::string tok = s.substr(i, j - i);
            char* end = nullptr;
            long v = std::strtol(tok.c_str(), &end, 10);
            if (!end || *end || v < 0 || v > INT32_MAX) fail(strfmt("--ids: '%s' is not a token id", tok.c_str()));
            ids.push_back(int32_t(v));
        }
        i = j + 1;
    }
    if (ids.empty()) fail("--ids: no token ids given");
    return ids;
}
}  // namespace

int cmd_logits(int argc, char** argv) {
    CLI::App app{"Write float32 logits [n_ids][n_vocab] for every position of a token id list", "qinfer logits"};
    std::string model_path, ids_str, out_path, kv = "f16", kv_v;
    int threads = 0, ctx = 0, gpu_layers = 0;
    app.add_option("-m,--model", model_path, "GGUF model file")->required();
    app.add_option("--gpu-layers,--n-gpu-layers", gpu_layers, "layers on the GPU (-ngl; 99 = all, with head)");
    app.add_option("--ids", ids_str, "comma-separated token ids, run as one prompt")->required();
    app.add_option("-o,--out", out_path, "output file (float32 little-endian)")->required();
    app.add_option("-t,--threads", threads, "CPU threads (default: physical cores)");
    app.add_option("-c,--ctx-size", ctx, "context size (default: number of ids)");
    add_kv_type_flags(app, kv, kv_v);
    if (const int rc = parse_llama_style(app, argc, argv); rc >= 0) return rc;

    const std::vector<int32_t> ids = parse_ids(ids_str);
    ModelOptions opt;
    opt.n_threads = threads;
    opt.gpu_layers = gpu_layers;
    opt.n_ctx = ctx > 0 ? ctx : int(ids.size());
    opt.n_batch = int(ids.size());
    opt.kv_type = *type_from_name(kv_cache_type_name(kv_type_from_flags(kv, kv_v)));  // the names are GGUF's
    if (int(ids.size()) > opt.n_ctx)
        fail(strfmt("%zu ids do not fit a context of %d tokens", ids.size(), opt.n_ctx));

    auto t0 = std::chrono::steady_clock::now();
    auto model = Model::load(model_path, opt);
    auto t1 = std::chrono::steady_clock::now();
    Batch batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], int32_t(i), 0, true);
    std::vector<float> logits;
    model->forward(batch, logits);
    auto t2 = std::chrono::steady_clock::now();

    FILE* f = utf8_fopen(out_path, "wb");
    if (!f) fail(strfmt("cannot open '%s' for writing", out_path.c_str()));
    // The on-disk format is little-endian f32; every supported target is little-endian.
    const size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
    if (std::fclose(f) != 0 || n != logits.size()) fail(strfmt("error writing '%s'", out_path.c_str()));

    const double load_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double fwd_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    std::fprintf(stderr, "%s: %zu tokens x %lld logits -> %s; load %.1f ms, forward %.1f ms (%.1f tok/s), %s\n",
                 model_path.c_str(), ids.size(), (long long)model->hparams().n_vocab, out_path.c_str(), load_ms, fwd_ms,
                 double(ids.size()) * 1000.0 / fwd_ms, model->backend_description().c_str());
    return 0;
}

}  // namespace qinfer::cli
