// `qinfer quantize IN.gguf OUT.gguf TYPE [-t N]`: llama-quantize without an
// importance matrix. TYPE is an ftype (q8_0, q4_0, q4_k_s, q4_k_m, q5_k_s,
// q5_k_m, q6_k, f16, bf16, f32); the per-tensor mix follows llama.cpp
// (convert/type_mix.h), tensors that are never quantized keep their type.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "common/platform.h"
#include "convert/type_mix.h"
#include "gguf/gguf.h"
#include "quant/requantize.h"

namespace qinfer::cli {

namespace {

// Names llama-quantize never quantizes beyond convert::quantizable's rules
// (llama-quant.cpp): MoE routers, BERT position/type embeddings, and small
// tensors of other architectures.
bool never_quantized(const std::string& name) {
    for (const char* s : {"ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "attn_rel_b.weight",
                          "shortconv.conv.weight", "time_mix_first.weight", "time_mix_w0.weight",
                          "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
                          "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
                          "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
                          "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight"})
        if (name.find(s) != std::string::npos) return true;
    return name == "position_embd.weight" || name == "token_types.weight";
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
    CLI::App app{"Requantize a GGUF file with a llama.cpp type mix (no importance matrix)", "qinfer quantize"};
    std::string in_path, out_path, type_name_arg;
    int threads = 0;
    bool quiet = false;
    app.add_option("input", in_path, "input GGUF (F32/F16/BF16 weights; quantized input loses quality)")->required();
    app.add_option("output", out_path, "output GGUF")->required();
    app.add_option("type", type_name_arg, std::string("file type: ") + convert::ftype_list())->required();
    app.add_option("-t,--threads", threads, "threads (default: physical cores)");
    app.add_flag("-q,--quiet", quiet, "no per-tensor lines");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    const auto ftype = convert::ftype_from_name(type_name_arg);
    if (!ftype) fail(strfmt("quantize: unknown type '%s' (expected one of: %s)", type_name_arg.c_str(), convert::ftype_list()));
    if (in_path == out_path) fail("quantize: the output must be a different file than the input");

    auto in = gguf::File::open(in_path);
    const std::string arch(in->require_string("general.architecture"));
    const int64_t n_layer = int64_t(in->require_uint(arch + ".block_count"));
    int64_t n_attn_v_like = 0;
    bool has_output = false;
    for (const auto& t : in->tensors()) {
        if (t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos ||
            t.name.find("attn_kv_b.weight") != std::string::npos)
            ++n_attn_v_like;
        has_output |= t.name == "output.weight";
    }
    convert::TypeMix mix(*ftype, n_layer, n_attn_v_like, has_output);

    RequantizeOptions opt;
    opt.n_threads = threads > 0 ? threads : physical_cores();
    opt.file_type = convert::llama_ftype(*ftype);
    opt.choose_type = [&](const gguf::TensorInfo& t) {
        // Dimensions as ggml_n_dims counts them: trailing 1s do not count.
        int dims = 1;
        for (int d = 1; d < int(t.n_dims); ++d)
            if (t.ne[d] > 1) dims = d + 1;
        // Ineligible tensors (1-D, norms, ssm_conv1d, ...) keep their source type.
        if (!convert::quantizable(t.name, dims) || never_quantized(t.name)) return t.type;
        return mix.next(t.name, dims, t.ne[0]);
    };
    if (!quiet) opt.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };

    std::fprintf(stderr, "quantize: %s -> %s as %s, %d threads\n", in_path.c_str(), out_path.c_str(),
                 convert::ftype_name(*ftype), opt.n_threads);
    const RequantizeStats st = requantize_file(*in, out_path, opt);
    std::printf("quantized %d of %d tensors: %.2f MiB -> %.2f MiB (file %.2f MiB), %.3f bits per weight, %.2f s\n",
                st.n_converted, st.n_tensors, double(st.in_data_bytes) / (1 << 20),
                double(st.out_data_bytes) / (1 << 20), double(st.out_file_bytes) / (1 << 20), st.bits_per_weight(),
                st.seconds);
    return 0;
}

}  // namespace qinfer::cli
