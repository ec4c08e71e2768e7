// Launch API of the CUDA kernels: plain C++ functions over device pointers, so
// the backend (and the unit tests) never see kernel syntax. Every function
// enqueues on `s` and returns at once; none synchronizes.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "quant/types.h"
#include "runtime/cuda/layout.h"

namespace qinfer::cuda {

// ---- activations for matrix products
// The activations are brought to the weight's "vec_dot type" first, exactly as
// the CPU backend does: 8-bit blocks for quantized weights (integer dot
// products), f32 as they are for F32 / F16 / BF16 weights. So CPU and GPU
// compute the same function up to the order of float additions.
enum class ActKind { F32, F16, BF16, Q8_0, Q8_1, Q8_K };
ActKind act_kind_for(GgmlType weight_type);

// Device layout of T quantized activation rows of K elements (one buffer):
//   qs int8 [T][K] | d f32 [T][K/bs] | s f32 [T][K/32] (Q8_1: f16(d*sum q)) |
//   bsum int16 [T][K/16] (sums of qs over 16 elements; all Q8 kinds)
// bs = 32 (Q8_0, Q8_1) or 256 (Q8_K). F16/BF16 (only for QINFER_CUDA_PREFILL=f16):
// [T][K] halves. F32: unused (the input rows themselves).
struct ActQ {
    const int8_t* qs = nullptr;
    const float* d = nullptr;
    const float* s = nullptr;
    const int16_t* bsum = nullptr;
    const void* half = nullptr;   // F16 / BF16 rows
    const float* f32 = nullptr;   // F32: the input itself (row stride K)
    int64_t K = 0;
};
size_t act_bytes(ActKind k, int64_t K, int64_t T);
ActQ act_view(ActKind k, const void* buf, const float* x, int64_t K, int64_t T);

// x: T rows of K f32 (row stride ldx floats), K a multiple of the block size.
void quantize_act(ActKind k, const float* x, int64_t ldx, int64_t K, int64_t T, void* buf, cudaStream_t s);

// ---- weights
struct DeviceWeight {
    GgmlType type = GgmlType::F32;
    int64_t K = 0;          // elements per row (ne0)
    int64_t N = 0;          // rows (ne1 * ne2 * ne3)
    const uint8_t* data = nullptr;
    WeightLayout layout;    // weight_layout(type, N * K / block_size)
};

// y[t][n] = sum_k W[n][k] x[t][k] (+ bias[n]) for t < T, n < N; y row stride ldy.
// Integer / half dot products straight from the quantized blocks, each weight
// byte read once per group of up to 8 tokens. `act` from quantize_act().
void matmul_vec(const DeviceWeight& w, const ActQ& act, int64_t T, float* y, int64_t ldy, const float* bias,
                cudaStream_t s);

// A sequence's tokens within a step (DeltaNet kernels, fused conv).
struct Segment {  // as StepInfo::Segment
    int32_t first, count, slot, pos0;
};

// Several quantized matrix-vector products over the same activations in one
// launch (q/k/v, gate/up, the four DeltaNet projections), each optionally with a
// residual epilogue: res_out[t][n] = res[t][n] + y[t][n] (y is written too).
// Every job's weight must be a quantized type with the activation kind `act` was
// made for; T <= 8.
//
// The causal conv + SiLU of a one-token product's output (conv1d_silu for a
// single segment of one token), computed row by row in the product's epilogue:
// one launch fewer per DeltaNet layer in decode, bit-identical results. w null:
// none. Applies with the K-quant rows kernel (v3) only (conv_after_fits).
struct ConvAfter {
    const float* w = nullptr;  // {K, C}
    int K = 0;
    float* state = nullptr;    // {C, K-1, n_slots}
    const Segment* seg = nullptr;  // the one segment (device): its slot
    float* out = nullptr;      // [C]
};
struct MatvecJob {
    DeviceWeight w;
    float* y = nullptr;
    int64_t ldy = 0;
    const float* bias = nullptr;
    const float* res = nullptr;  // residual input (null: none)
    float* res_out = nullptr;
    int64_t ld_res = 0, ld_res_out = 0;
    ConvAfter conv;
};
constexpr int kMaxMatvecJobs = 4;
void matmul_vec_multi(const MatvecJob* jobs, int n_jobs, const ActQ& act, int64_t T, cudaStream_t s);
bool matvec_multi_supports(GgmlType t);
// Whether the products of a one-token batch run where a ConvAfter can ride along.
bool conv_after_fits(const MatvecJob* jobs, int n_jobs, int64_t T);
// Which kernel computes one-token quantized products (matmul_vec, matmul_vec_multi
// with T = 1): 3 (default) several rows per warp for K-quants (other types as
// 2); 2 one warp per row; 1 as 2 with the plain Q4_K loop. All give
// bit-identical results. QINFER_CUDA_MATVEC=v1 / v2 picks an older one (A/B
// measurements); set_matvec_variant(v) overrides that (0: the environment's).
int matvec_variant();
void set_matvec_variant(int v);
// Rows per warp of v3 for Q4_K (Q5_K / Q6_K: half): by default chosen per launch
// from its rows; 1, 2, 4 or 8 from QINFER_CUDA_MV_ROWS or set_matvec_rows(r)
// fixes it (0: back to the environment's / the automatic choice).
void set_matvec_rows(int r);
// Steps of weight loads a lane of a one-row-per-warp v3 product keeps in flight
// (the first S issued before the kernel waits for its inputs): 1, 2 or 4 from
// QINFER_CUDA_MV_STEPS or set_matvec_steps(s) (0: the environment's, by default
// 4). Results are the same bits whatever S.
void set_matvec_steps(int s);

// Same product for many tokens on the tensor cores (int8 mma for quantized
// weights, from the same quantized activations). Falls back to matmul_vec for
// types it does not cover. Returns false when it did not handle the case.
// K-quants default to the f16-tensor-core kernel (exact integer products, see
// mma_f16.cu); QINFER_CUDA_MMA=int8 selects the int8 one, =0 the matvec path.
// Whether matmul_mma takes an N-row product of T tokens (else the caller's matvec path).
bool mma_applies(int64_t N, int64_t T);
bool matmul_mma(const DeviceWeight& w, const ActQ& act, int64_t T, float* y, int64_t ldy, const float* bias,
                cudaStream_t s);
bool matmul_hmma(const DeviceWeight& w, const ActQ& act, int64_t T, float* y, int64_t ldy, const float* bias,
                 cudaStream_t s);

// out[t][0..K) = dequantize(row ids[t] of w) as f32 (row stride ldo floats).
void get_rows(const DeviceWeight& w, const int32_t* ids, int64_t T, float* out, int64_t ldo, cudaStream_t s);
// Rows [row0, row0 + n) dequantized to f16 (for the cuBLAS prefill path): out [n][K].
void dequant_f16(const DeviceWeight& w, int64_t row0, int64_t n, void* out, cudaStream_t s);
// Rows [row0, row0 + n) dequantized to f32: out [n][K].
void dequant_f32(const DeviceWeight& w, int64_t row0, int64_t n, float* out, cudaStream_t s);
// f32 -> f16 / bf16 rows (x row stride ldx, out contiguous [T][K]).
void convert_rows(const float* x, int64_t ldx, int64_t K, int64_t T, GgmlType to, void* out, cudaStream_t s);

// ---- row-wise ops. A "rows" argument describes n rows of `n` f32 elements at
// data + i1*s1 + i2*s2 (i1 < n1, i2 < n2), strides in floats.
struct Rows {
    float* data = nullptr;
    int64_t n = 0;          // elements per row
    int64_t n1 = 1, n2 = 1; // rows = n1 * n2
    int64_t s1 = 0, s2 = 0; // row strides in floats
};

void rms_norm(Rows x, const float* w, float eps, Rows y, cudaStream_t s);
void l2_norm(Rows x, float eps, Rows y, cudaStream_t s);
void rms_norm_gated(Rows x, const float* w, Rows z, float eps, Rows y, cudaStream_t s);
void add(Rows a, Rows b, Rows y, cudaStream_t s);
void swiglu(Rows gate, Rows up, Rows y, cudaStream_t s);
void sigmoid_mul(Rows x, Rows gate, Rows y, cudaStream_t s);
void copy_rows(Rows src, Rows dst, cudaStream_t s);
// In place NEOX rope on x rows (n1 = heads, n2 = tokens); angle pos[t] * freq_scale * base^(-2i/n_rot).
void rope_neox(Rows x, const int32_t* pos, int n_rot, float base, float freq_scale, cudaStream_t s);

// ---- producers fused with the activation quantization that follows them
// What quantize_act(kind, x, ldx, K, T, buf) would be given.
struct ActDest {
    ActKind kind = ActKind::F32;
    const float* x = nullptr;
    int64_t ldx = 0, K = 0, T = 0;
    void* buf = nullptr;
};
// A norm as rms_norm / l2_norm / rms_norm_gated take it.
enum class NormOp { Rms, L2, RmsGated };
struct NormJob {
    NormOp op = NormOp::Rms;
    Rows x, z, y;              // z: RmsGated only
    const float* w = nullptr;  // Rms, RmsGated
    float eps = 0.f;
};
// The norm and then quantize_act(q) of its output, in one launch: y is written
// as the norm writes it and the quants are bit-identical to the two ops run one
// by one. Applies (else the launch fails) to Rms / RmsGated rows of at most 8192
// floats that are exactly q's input rows (a token row may be several norm rows,
// e.g. heads, when their length is a power of two), q an 8-bit kind.
bool norm_quantize_fits(const NormJob& j, const ActDest& q);
void norm_quantize(const NormJob& j, const ActDest& q, cudaStream_t s);
// Two norms of one kind, eps and row length (q and k heads) in one launch, the
// results those of a then b; applies when b neither reads nor writes what a
// writes, nor writes what a reads.
bool norm_pair_fits(const NormJob& a, const NormJob& b);
void norm_pair(const NormJob& a, const NormJob& b, cudaStream_t s);
// The rotation frequencies base^(-2i / n_rot) of rope_neox's pairs, computed
// on the host exactly as the CPU backend computes them (std::pow in double) and
// passed to the kernels by value, so a step's angles cost one multiply each.
constexpr int kMaxRopePairs = 128;
struct RopeFreqs {
    double inv[kMaxRopePairs];
};
RopeFreqs rope_freqs(int n_rot, float base);
// An rms_norm (or an independent pair) and then rope_neox on its output rows,
// in one launch; the same values as the ops one by one. Applies when the rope's
// rows are the norm's output rows (at most 64 tokens of heads up to 2048 floats)
// and n_rot is a multiple of 16, at most 256.
struct RopeJob {  // rope_neox's arguments
    Rows x;
    const int32_t* pos = nullptr;
    int n_rot = 0;
    float base = 0.f, freq_scale = 0.f;
};
bool norm_rope_fits(const NormJob& a, const NormJob* b, const RopeJob& ra, const RopeJob* rb);
struct KvStoreJob;
// With `store`: the same launch also writes the step's cache rows, k as b and
// its rope leave it (kv_store's bytes; see norm_rope_store_fits).
void norm_rope(const NormJob& a, const NormJob* b, const RopeJob& ra, const RopeJob* rb, cudaStream_t s,
               const KvStoreJob* store = nullptr);
// swiglu / sigmoid_mul and then quantize_act(q) of their output, likewise.
enum class Gate { Swiglu, SigmoidMul };
bool gate_quantize_fits(Rows a, Rows b, Rows y, const ActDest& q);
// Whether op rows r (n elements each) are exactly the quantization input of
// `q`: K = m * n, and row t*m + j starts at q.x + t*ldx + j*n.
bool rows_are_act_input(const Rows& r, const ActDest& q, int64_t m);
// Rows of whole 8-bit blocks (as every matrix product's input is): a warp never
// stores past its token row.
bool whole_blocks(const ActDest& q);
void gate_quantize(Gate op, Rows a, Rows b, Rows y, const ActDest& q, cudaStream_t s);

// ---- a whole decode FFN block in one launch
// h = rms_norm(x) (norm), its quantization (act_h), gate / up = products of it,
// s = swiglu(gate, up) (gate, up, s: Rows), its quantization (act_s), down =
// product of s with the residual epilogue: the ops of ffn_block for one token,
// each result written where the op writes it and bit for bit the same (the
// same arithmetic in the same order as the fused producers and the one-token
// row kernels). One resident wave of blocks; the phases meet at grid-wide
// barriers (`barrier`: two zeroed words on the device, used by one stream);
// every block computes the norm and quantization itself, and the weights of
// all three products are prefetched into L2 at the start.
struct FfnJob {
    NormJob norm;
    ActDest act_h;
    MatvecJob gate, up;
    Rows ga, ub, s;
    ActDest act_s;
    MatvecJob down;
    unsigned* barrier = nullptr;
};
bool ffn_decode_fits(const FfnJob& j);
void ffn_decode(const FfnJob& j, cudaStream_t s);
// QINFER_CUDA_FFN_CLOCKS=1: ffn_decode adds up the SM cycles of its phases;
// this prints their mean per block run (stderr).
bool ffn_clocks_enabled();
void ffn_print_clocks();

// ---- attention over the KV cache
struct KvView {
    void* k = nullptr;       // {d, n_kv, n_ctx, n_slots}
    void* v = nullptr;
    GgmlType type = GgmlType::F16;  // F16, F32 or Q8_0 (rows of d / 32 GGUF blocks)
    int64_t d = 0, n_kv = 0, n_ctx = 0, n_slots = 0;
};
// Writes k, v rows (Rows over heads x tokens) into the cache at (slot[t], pos[t]);
// a q8_0 cache gets the same bytes as the CPU backend's quantize_row.
void kv_store(Rows k, Rows v, const KvView& kv, const int32_t* pos, const int32_t* slot, int64_t T, cudaStream_t s);
// kv_store's arguments, for a decode step's q / k norm + rope launch to do its
// work: the k rows are the second norm's (and rope's) output, so the store
// needs no launch of its own. Applies to an F32 / F16 / Q8_0 cache of heads of
// a multiple of 32 floats, v rows that the norms neither read nor write, and
// the rope's positions.
struct KvStoreJob {
    Rows k, v;
    KvView kv;
    const int32_t* pos = nullptr;
    const int32_t* slot = nullptr;
};
bool norm_rope_store_fits(const NormJob& a, const NormJob& b, const RopeJob& ra, const RopeJob& rb,
                          const KvStoreJob& st);
// out[t][h][:] = softmax(scale q.K[j]) V[j] over j <= pos[t] in slot[t]. q Rows (n1 = n_head,
// n2 = T), out contiguous [T][n_head][d]. max_seg_len: the most tokens of one
// sequence in the step (decode steps, up to 64 tokens and 4 per sequence, split
// the key range; see attention.cu). `work` >= attention_work_bytes(...) of the
// same T, max_ctx (= kv.n_ctx) and max_seg_len.
size_t attention_work_bytes(int64_t T, int64_t n_head, int64_t d, int64_t max_ctx, int max_seg_len);
// Steps of up to t tokens may take the split kernel (default 64; 0: back to the
// default / QINFER_CUDA_ATTN_SPLIT_T). For tests and A/B runs.
void set_attention_split_max_tokens(int t);
// With the step's segments (device array, n_seg of them), prompt steps take
// attention_prefill (below) where it applies. fresh > 0: a token at position p
// finds the rows of its slot below p + 1 - fresh written before the kernel chain
// that this launch joins began (fresh >= the most tokens of one slot in the
// step, whose rows kv_store writes just before), so the tensor-core split kernel
// starts loading them before it waits on the kernels before it. 0: it waits first.
//
// `quant` (decode): the quantization of out for the product after it -- of out
// itself, or (gated) of y = a * sigmoid(b) where a is out's rows, as
// gate_quantize computes it -- done by the launch that merges the key-range
// splits, so it needs no launch of its own. Returns whether it was done (the
// split kernel ran, and the rows fit: attention_quantize_fits); where not, the
// caller runs it as before.
struct AttnQuant {
    bool gated = false;
    Rows a, b, y;  // gated only
    ActDest q;
};
bool attention_quantize_fits(const AttnQuant& e, const float* out, int64_t n_head, int64_t d, int64_t T);
bool attention(Rows q, const KvView& kv, const int32_t* pos, const int32_t* slot, int64_t T, float scale,
               float* out, void* work, int max_seg_len, cudaStream_t s, const Segment* seg = nullptr, int n_seg = 0,
               int fresh = 0, const AttnQuant* quant = nullptr);
// The same attention for prompt steps on the tensor cores (attention_prefill.cu):
// tokens given as segments (device array of n_seg, contiguous runs of one
// sequence in batch order; token first + i at position pos0 + i of slot). Q and
// P are rounded to f16 (relative error ~1e-3 of the f32 kernel). Returns false,
// launching nothing, where it does not apply (f32 cache, head dim not 64 / 128 /
// 256, more than 8 or a non-power-of-two number of query heads per kv head).
bool attention_prefill(Rows q, const KvView& kv, const Segment* seg, int n_seg, int64_t T, float scale, float* out,
                       cudaStream_t s);

// ---- Gated DeltaNet
// conv state {C, K-1, n_slots} f32; x, out [T][C] (row strides ldx / ldo floats); w {K, C}.
// max_seg_len: the longest segment's token count (sizes the grid).
void conv1d_silu(const float* x, int64_t ldx, const float* w, int K, int64_t C, float* state, int n_slots,
                 const Segment* seg, int n_seg, int max_seg_len, float* out, int64_t ldo, cudaStream_t s);
struct DeltaArgs {
    const float* q; const float* k; const float* v;   // per token rows: q/k [Hk][dk], v [Hv][dv]
    int64_t q_t, k_t, v_t;                             // token strides (floats); heads contiguous at dk / dv
    int64_t q_h, k_h, v_h;                             // head strides (floats)
    const float* a; const float* b; int64_t a_t, b_t;  // [T][Hv]
    const float* dt_bias; const float* ssm_a;          // [Hv]
    float* S;                                          // {dk, dv, Hv, n_slots}
    float* out;                                        // [T][Hv][dv] contiguous
    int dk, dv, Hk, Hv;
    // The token-serial kernel L2-normalizes q and k itself (x / max(|x|, l2_eps),
    // as l2_norm; the sum of squares in another order): two launches fewer per
    // DeltaNet layer in decode. Only where gdr_normalizes_fits.
    bool l2_qk = false;
    float l2_eps = 0.f;
    // The state was last written before the kernel chain that this launch joins
    // began (by a copy, or by a kernel followed by a copy or a synchronization):
    // the token-serial kernel loads it before it waits on the kernels before it.
    bool state_early = false;
};
// Token-serial kernel (decode, short segments) or chunked kernel (prompts); Auto
// picks by max_seg_len unless QINFER_CUDA_GDR=serial|chunked says otherwise.
// Chunked needs d_k 64 or 128, d_v a multiple of 32 and 16-byte aligned q/k rows
// (else serial).
enum class GdrPath { Auto, Serial, Chunked };
void gated_delta_rule(const DeltaArgs& a, const Segment* seg, int n_seg, int max_seg_len, cudaStream_t s,
                      GdrPath path = GdrPath::Auto);
// Whether gated_delta_rule runs every segment on the token-serial kernel (the one
// that can take l2_qk).
bool gdr_all_serial(const DeltaArgs& a, int max_seg_len, GdrPath path = GdrPath::Auto);
// A decode step's delta rule (one token per segment, d_v = 128) together with
// rms_norm_gated of its output heads and that norm's quantization for the next
// product (norm_quantize), in one launch: clusters of 2 x 4 blocks hold a pair
// of value heads, whose first block applies the norm and quantizes the pair's
// 256 elements. Bit-identical to the two launches. sm_90+ code only (else
// gdr_norm_fits is false).
bool gdr_norm_fits(const DeltaArgs& a, int max_seg_len, const NormJob& norm, const ActDest& q);
void gated_delta_rule_norm(const DeltaArgs& a, const Segment* seg, int n_seg, const NormJob& norm, const ActDest& q,
                           cudaStream_t s);

// ---- sampling
// ids[t] = argmax of row t (lowest index wins ties). logits rows of n, stride ld.
void argmax_rows(const float* logits, int64_t ld, int64_t n, int64_t T, int32_t* ids, cudaStream_t s);
// Caps the blocks argmax_rows spreads one row over (tests: 1 forces one block per row; 0: no cap).
void set_argmax_cluster(int cs);
// values[t * k + j], ids[t * k + j] (j < k): the k largest logits of row t < T
// in Backend::top_k's order. 1 <= k <= min(256, n). `work`: top_k_work_bytes.
size_t top_k_work_bytes(int64_t n, int64_t T, int k);
void top_k_rows(const float* logits, int64_t ld, int64_t n, int64_t T, int k, float* values, int32_t* ids,
                void* work, cudaStream_t s);

// ---- profiling
// Holds the stream until the host writes a value >= `value` into `flag`
// (host-mapped memory): the host then queues a run of kernels with timing
// events between them, and the GPU runs them back to back once released.
void hold_until(const volatile int* flag, int value, cudaStream_t s);

// What a kernel boundary costs in a captured graph, as a decode step replays
// it (launch_probe.cu): microseconds per kernel over chains of n launches.
struct LaunchCost {
    double empty_block = 0;      // a one-block kernel that does nothing
    double chain_block = 0;      // one block that waits for the kernel before and reads what it wrote
    double chain_grid = 0;       // the same with a full grid (4 blocks of 128 threads per SM)
    double chain_grid_plain = 0; // the full grid without programmatic dependent launch
    long long last_value = 0;    // chains: what the last kernel wrote (launches made, if each waited)
    long long launches = 0;
};
// Replays each chain `replays` times after one warm-up; per-kernel times are
// the fastest replay's. The chains' counters start at 0, so a chain whose
// kernels all waited for the one before ends at launches = (1 + replays) * n.
LaunchCost probe_launch_cost(int n, int replays, cudaStream_t s);

}  // namespace qinfer::cuda
