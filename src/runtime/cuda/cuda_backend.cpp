// CUDA backend: memory, uploads, graphs and the op dispatch to kernels.h.
#include "runtime/cuda/cuda_backend.h"

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/env.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/sizing.h"
#include "runtime/cuda/layout.h"

namespace qinfer {
namespace cuda {
bool pdl_enabled();  // launch.cuh (device code: not includable here)
void pdl_configure_device();
}

using cuda::Rows;

namespace {

// Ops by the first word of their signature (sig() calls below): profile
// labels and QINFER_CUDA_SKIP_OPS.
const char* op_name(uint32_t code) {
    switch (code) {
        case 1: return "get_rows";
        case 2: return "matmul";
        case 3: return "rms_norm";
        case 4: return "l2_norm";
        case 5: return "rms_norm_gated";
        case 6: return "add";
        case 7: return "swiglu";
        case 8: return "sigmoid_mul";
        case 9: case 10: return "copy";
        case 11: return "rope_neox";
        case 12: return "attention";  // kv store + attention
        case 13: return "conv1d_silu";
        case 14: return "gated_delta_rule";
        case 15: return "argmax";
        case 16: return "quantize";  // activations for a product
        case 17: return "top_k";
        case 0x46: return "fill_zero";
        case 0x43: return "copy_bytes";
        default: return nullptr;
    }
}

std::vector<uint32_t> parse_skip_ops(const char* spec) {
    std::vector<uint32_t> codes;
    if (!spec) return codes;
    std::string s(spec);
    for (char& c : s)
        if (c == ',' || c == '+') c = ':';
    size_t at = 0;
    while (at <= s.size()) {
        const size_t end = std::min(s.find(':', at), s.size());
        const std::string name = s.substr(at, end - at);
        at = end + 1;
        if (name.empty()) continue;
        bool found = false;
        for (uint32_t c = 0; c < 0x80; ++c)
            if (const char* n = op_name(c); n && name == n) {
                codes.push_back(c);
                found = true;
            }
        if (!found) fail(strfmt("QINFER_CUDA_SKIP_OPS: no op named '%s'", name.c_str()));
    }
    return codes;
}

#define QINFER_CUBLAS_CHECK(call)                                                                    \
    do {                                                                                             \
        cublasStatus_t st_ = (call);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) fail(strfmt("cuBLAS error %d in %s", int(st_), #call));  \
    } while (0)

// Rows view of an f32 tensor: ne[0] contiguous elements per row, rows over
// dims 1..3 (dims 2 and 3 merged when they are contiguous with each other).
Rows rows_of(const Tensor& t, const char* op) {
    if (t.type != GgmlType::F32 || t.nb[0] != 4)
        fail(strfmt("CUDA %s: tensor '%s' must be f32 with contiguous rows", op, t.name));
    Rows r;
    r.data = static_cast<float*>(t.data);
    r.n = t.ne[0];
    r.n1 = t.ne[1];
    r.s1 = int64_t(t.nb[1] / 4);
    if (t.ne[3] > 1 && t.ne[2] > 1 && t.nb[3] != t.nb[2] * size_t(t.ne[2]))
        fail(strfmt("CUDA %s: tensor '%s' %s has a layout the kernels do not take", op, t.name, shape_str(t).c_str()));
    r.n2 = t.ne[2] * t.ne[3];
    r.s2 = int64_t((t.ne[2] > 1 ? t.nb[2] : t.nb[3]) / 4);
    return r;
}

Rows bias_rows(const float* b, int64_t n, int64_t T) {
    Rows r;
    r.data = const_cast<float*>(b);
    r.n = n;
    r.n1 = T;
    return r;  // strides 0: every row is the bias
}

}  // namespace

// ---------------------------------------------------------------- lifetime

CudaBackend::CudaBackend(int device, uint64_t memory_limit) : device_(device), limit_(memory_limit) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) fail(strfmt("CUDA: no usable GPU (%s)", cudaGetErrorString(e)));
    if (device < 0 || device >= n) fail(strfmt("CUDA: device %d does not exist (%d present)", device, n));
    QINFER_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    QINFER_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8)
        fail(strfmt("CUDA: %s has compute capability %d.%d; the kernels need 8.0 or newer", prop.name, prop.major,
                    prop.minor));
    name_ = strfmt("CUDA%d", device);
    cuda::pdl_configure_device();
    QINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    QINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
    cublasHandle_t h = nullptr;
    QINFER_CUBLAS_CHECK(cublasCreate(&h));
    cublas_ = h;
    QINFER_CUBLAS_CHECK(cublasSetStream(h, stream_));
    // Our own workspace, so cuBLAS never allocates inside a graph capture.
    QINFER_CUBLAS_CHECK(cublasSetWorkspace(h, scratch(cublas_ws_, size_t(32) << 20, "cublas"), size_t(32) << 20));
    warm_up_cublas();
    graphs_enabled_ = !env_is("QINFER_CUDA_GRAPHS", "0");
    fuse_ = !env_is("QINFER_CUDA_FUSE", "0");
    fuse_norm_ = fuse_ && !env_is("QINFER_CUDA_FUSE_NORM", "0");
    fuse_conv_ = fuse_ && !env_is("QINFER_CUDA_FUSE_CONV", "0");
    fuse_l2_ = fuse_ && !env_is("QINFER_CUDA_FUSE_L2", "0");
    fuse_gdr_norm_ = fuse_ && !env_is("QINFER_CUDA_FUSE_GDR_NORM", "0");
    fuse_kv_store_ = fuse_ && !env_is("QINFER_CUDA_FUSE_KV_STORE", "0");
    fuse_attn_quant_ = fuse_ && !env_is("QINFER_CUDA_FUSE_ATTN_QUANT", "0");
    fuse_ffn_ = fuse_ && env_is("QINFER_CUDA_FUSE_FFN", "1");
    QINFER_CUDA_CHECK(cudaMemset(scratch(ffn_barrier_, 256, "FFN barrier"), 0, 256));
    profile_ = env_is("QINFER_CUDA_PROFILE", "1");
    skip_ops_ = parse_skip_ops(std::getenv("QINFER_CUDA_SKIP_OPS"));
    if (profile_) {
        graphs_enabled_ = true;  // ops are queued (so fusion happens) but never recorded
        QINFER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&hold_flag_), sizeof(int), cudaHostAllocMapped));
        *hold_flag_ = 0;
        QINFER_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hold_flag_dev_), hold_flag_, 0));
    }
}

CudaBackend::~CudaBackend() {
    // No throwing here: run what is queued if possible, then release.
    try {
        flush();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error in queued work at shutdown: %s\n", name_.c_str(), e.what());
    }
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(upload_stream_);
    cuda::ffn_print_clocks();
    if (std::getenv("QINFER_CUDA_VERBOSE")) {
        size_t n = 0, bytes = 0, declined = 0;
        for (const auto& kv : weights_) {
            if (kv.second.f16) bytes += kv.second.f16_bytes(), ++n;
            declined += kv.second.f16_declined;
        }
        if (n + declined > 0)
            std::fprintf(stderr, "%s: f16 copies of %zu prompt weights (%.2f GiB); %zu weights without one (no room)\n",
                         name_.c_str(), n, double(bytes) / (1 << 30), declined);
    }
    if (profile_) {
        print_profile();
        for (cudaEvent_t e : profile_events_) cudaEventDestroy(e);
        if (hold_flag_) cudaFreeHost(hold_flag_);
    }
    for (auto& kv : auto_graphs_) destroy_graph(kv.second);
    for (auto& kv : keyed_graphs_) destroy_graph(kv.second);
    for (auto& kv : owned_) cudaFree(const_cast<void*>(kv.first));
    for (auto& kv : weights_)
        if (kv.second.f16) cudaFree(kv.second.f16);
    for (Scratch* s : {&act_buf_[0], &act_buf_[1], &attn_work_, &half_w_, &half_x_, &ids_buf_, &top_k_work_,
                       &cublas_ws_, &ffn_barrier_})
        if (s->p) cudaFree(s->p);
    for (int i = 0; i < kStaging; ++i) {
        if (staging_[i]) cudaFreeHost(staging_[i]);
        if (staging_done_[i]) cudaEventDestroy(staging_done_[i]);
    }
    for (AsyncRead& r : async_reads_) {
        if (r.pinned) cudaFreeHost(r.pinned);
        if (r.done) cudaEventDestroy(r.done);
    }
    for (const auto& r : pinned_ranges_) cudaHostUnregister(const_cast<uint8_t*>(r.first));
    if (raw_stage_) cudaFree(raw_stage_);
    if (streamed_) cudaEventDestroy(streamed_);
    if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
    if (upload_stream_) cudaStreamDestroy(upload_stream_);
    if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const { return name_; }

// One f16 product of a prompt step's kind (weight rows x K times K x tokens,
// f32 out) at start-up: the process's first cuBLAS product cost ~50 ms on an
// H200 (library set-up, kernels loaded on first use), which the first long
// prompt after loading would otherwise pay in its time to first token. The
// 3 MB it borrows are not counted against the memory limit and it is skipped
// when they are not there: only speed is at stake.
void CudaBackend::warm_up_cublas() {
    constexpr int M = 256, N = 256, K = 2560;
    const size_t a_bytes = size_t(M) * K * 2, b_bytes = size_t(K) * N * 2, c_bytes = size_t(M) * N * 4;
    void* buf = nullptr;
    if (cudaMalloc(&buf, a_bytes + b_bytes + c_bytes) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    uint8_t* p = static_cast<uint8_t*>(buf);
    QINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, a_bytes + b_bytes, stream_));
    const float one = 1.f, zero = 0.f;
    const cublasStatus_t st = cublasGemmEx(static_cast<cublasHandle_t>(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, M, N, K,
                                           &one, p, CUDA_R_16F, K, p + a_bytes, CUDA_R_16F, K, &zero,
                                           p + a_bytes + b_bytes, CUDA_R_32F, M, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    const cudaError_t e = cudaStreamSynchronize(stream_);
    cudaFree(buf);
    if (st != CUBLAS_STATUS_SUCCESS) fail(strfmt("cuBLAS warm-up product: error %d", int(st)));
    QINFER_CUDA_CHECK(e);
}

template <class... A> void CudaBackend::sig(const A&... a) {
    if (!deferring()) return;
    last_sig_at_ = sig_.size();
    auto put = [this](const auto& v) {
        static_assert(std::is_trivially_copyable_v<std::decay_t<decltype(v)>>, "signature values must be plain");
        const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
        sig_.insert(sig_.end(), p, p + sizeof(v));
    };
    (put(a), ...);
}


std::unique_ptr<Backend> make_cuda_backend(int device, uint64_t memory_limit) {
    return std::make_unique<CudaBackend>(device, memory_limit);
}

bool cuda_memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
    size_t f = 0, t = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    *free_bytes = f;
    *total_bytes = t;
    return true;
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

void* CudaBackend::scratch(Scratch& s, size_t bytes, const char* what) {
    if (bytes <= s.bytes) return s.p;
    if (capturing_)
        fail(strfmt("CUDA: %s buffer must grow to %zu bytes inside a graph capture", what, bytes));
    // Growing inside an explicit step (its ops are being issued): the step runs
    // eagerly this time and is recorded at its next sighting, with the new size.
    if (in_keyed_ && !keyed_eager_) keyed_graphs_[keyed_key_].seen = 0;
    flush();  // queued ops still use the old buffer
    if (s.p) {
        QINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();  // recorded steps point at the old buffer
        device_free(s.p, s.bytes);
        s.p = nullptr;
        s.bytes = 0;
    }
    bytes = (bytes + 255) & ~size_t(255);
    s.p = device_malloc(bytes, strfmt("%s scratch", what).c_str());
    s.bytes = bytes;
    return s.p;
}

// Every device allocation goes through here, so a memory limit (--vram-limit)
// is honoured exactly and an out-of-memory error says how much was in use.
void* CudaBackend::device_malloc(size_t bytes, const char* what) {
    constexpr double MiB = 1024.0 * 1024.0;
    if (limit_ > 0 && in_use_ + bytes > limit_)
        fail(strfmt("CUDA: out of memory allocating %s (%.1f MiB; %.1f MiB in use, limit %.1f MiB)", what,
                    double(bytes) / MiB, double(in_use_) / MiB, double(limit_) / MiB));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the error so the backend stays usable
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        fail(strfmt("CUDA: out of memory allocating %s (%.1f MiB; %.1f MiB in use, %.1f MiB free on the device)", what,
                    double(bytes) / MiB, double(in_use_) / MiB, double(free_b) / MiB));
    }
    in_use_ += bytes;
    return p;
}

void CudaBackend::device_free(void* p, size_t bytes) {
    if (!p) return;
    QINFER_CUDA_CHECK(cudaFree(p));
    in_use_ -= std::min<uint64_t>(in_use_, bytes);
}

// ---------------------------------------------------------------- memory

Tensor CudaBackend::alloc(GgmlType type, std::initializer_list<int64_t> ne, const char* name) {
    Tensor t;
    t.type = type;
    int i = 0;
    for (int64_t n : ne) t.ne[i++] = n;
    set_contiguous_strides(t);
    t.backend = this;
    t.name = name;
    const size_t bytes = std::max<size_t>(t.nbytes(), 1);
    void* p = device_malloc(bytes, strfmt("%s %s", name, shape_str(t).c_str()).c_str());
    QINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    owned_[p] = bytes;
    t.data = p;
    return t;
}

void CudaBackend::free(Tensor& t) {
    auto it = owned_.find(t.data);
    if (it == owned_.end()) return;
    flush();
    QINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();  // a recorded step may use the buffer
    device_free(t.data, it->second);
    // Weights registered inside the buffer (upload_weight's own, or streamed into an arena).
    const uint8_t *lo = static_cast<const uint8_t*>(t.data), *hi = lo + it->second;
    owned_.erase(it);
    for (auto w = weights_.begin(); w != weights_.end();) {
        const uint8_t* p = static_cast<const uint8_t*>(w->first);
        if (p < lo || p >= hi) {
            ++w;
            continue;
        }
        if (w->second.f16) device_free(w->second.f16, w->second.f16_bytes());
        w = weights_.erase(w);
    }
    wrote(t);
    t.data = nullptr;
}

Tensor CudaBackend::upload_weight(const gguf::TensorInfo& ti) {
    Tensor t = upload_blocks(ti.type, ti.ne, ti.data, ti.name.c_str());
    return t;
}

Tensor CudaBackend::upload_weight_bytes(GgmlType type, std::initializer_list<int64_t> ne, const void* data,
                                        const char* name) {
    int64_t n[4] = {1, 1, 1, 1};
    int i = 0;
    for (int64_t v : ne) n[i++] = v;
    Tensor t = upload_blocks(type, n, data, name);
    QINFER_CUDA_CHECK(cudaStreamSynchronize(upload_stream_));
    return t;
}

// A weight's descriptor after the checks every weight on this backend passes.
Tensor CudaBackend::weight_desc(GgmlType type, const int64_t ne[4], const char* name) const {
    if (!cuda::cuda_supports_weight_type(type) && type != GgmlType::I32)
        fail(strfmt("CUDA: tensor '%s' has type %s, which the CUDA kernels do not handle", name, type_name(type)));
    const TypeTraits& tt = traits(type);
    if (ne[0] % tt.block_size != 0)
        fail(strfmt("CUDA: tensor '%s': rows of %lld are not whole %s blocks", name, (long long)ne[0], tt.name));
    return tensor_desc(type, ne, const_cast<CudaBackend*>(this), name);
}

Tensor CudaBackend::upload_blocks(GgmlType type, const int64_t ne[4], const void* data, const char* name) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor t = weight_desc(type, ne, name);
    const TypeTraits& tt = traits(type);
    const int64_t n_blocks = t.n_elements() / tt.block_size;
    const cuda::WeightLayout l = cuda::weight_layout(type, n_blocks);
    void* dev = device_malloc(std::max<size_t>(l.total, 1), strfmt("weight '%s'", name).c_str());
    owned_[dev] = l.total;
    t.data = dev;

    copy_weight_blocks(type, l, n_blocks, static_cast<const uint8_t*>(data), static_cast<uint8_t*>(dev));
    cuda::DeviceWeight dw;
    dw.type = type;
    dw.K = ne[0];
    dw.N = t.n_rows();
    dw.data = static_cast<const uint8_t*>(dev);
    dw.layout = l;
    weights_[dev] = WeightInfo{dw, true};
    upload_bytes_ += l.total;
    upload_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    load_stats_printed_ = false;
    return t;
}

// Streams n_blocks GGUF blocks from host memory to dst in the GPU layout:
// repacked chunk by chunk into the pinned ring, each chunk's copies queued on
// the upload stream (a ring buffer is reused once its previous copy is done).
void CudaBackend::copy_weight_blocks(GgmlType type, const cuda::WeightLayout& l, int64_t n_blocks,
                                     const uint8_t* src, uint8_t* d) {
    const TypeTraits& tt = traits(type);
    const size_t per_block = l.main_bytes + l.qh_bytes + l.d_bytes;
    const int64_t chunk = std::max<int64_t>(1, int64_t(kStagingBytes / per_block));
    for (int64_t b0 = 0; b0 < n_blocks; b0 += chunk) {
        const int64_t cnt = std::min(chunk, n_blocks - b0);
        const int s = staging_next_;
        staging_next_ = (s + 1) % kStaging;
        if (!staging_[s]) {
            QINFER_CUDA_CHECK(cudaMallocHost(&staging_[s], kStagingBytes));
            QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[s], cudaEventDisableTiming));
        } else {
            QINFER_CUDA_CHECK(cudaEventSynchronize(staging_done_[s]));  // its previous copy is done
        }
        uint8_t* stg = static_cast<uint8_t*>(staging_[s]);
        uint8_t* sq = stg + size_t(cnt) * l.main_bytes;
        uint8_t* sd = sq + size_t(cnt) * l.qh_bytes;
        cuda::repack_blocks(type, src + size_t(b0) * tt.type_size, cnt, stg, l.qh_bytes ? sq : nullptr,
                            l.d_bytes ? sd : nullptr);
        QINFER_CUDA_CHECK(cudaMemcpyAsync(d + size_t(b0) * l.main_bytes, stg, size_t(cnt) * l.main_bytes,
                                          cudaMemcpyHostToDevice, upload_stream_));
        if (l.qh_bytes)
            QINFER_CUDA_CHECK(cudaMemcpyAsync(d + l.off_qh + size_t(b0) * l.qh_bytes, sq, size_t(cnt) * l.qh_bytes,
                                              cudaMemcpyHostToDevice, upload_stream_));
        if (l.d_bytes)
            QINFER_CUDA_CHECK(cudaMemcpyAsync(d + l.off_d + size_t(b0) * l.d_bytes, sd, size_t(cnt) * l.d_bytes,
                                              cudaMemcpyHostToDevice, upload_stream_));
        QINFER_CUDA_CHECK(cudaEventRecord(staging_done_[s], upload_stream_));
    }
}

// Before the first op after uploads: wait for the copies, report the load.
void CudaBackend::print_load_stats_once() {
    if (load_stats_printed_) return;
    const auto t0 = std::chrono::steady_clock::now();
    QINFER_CUDA_CHECK(cudaStreamSynchronize(upload_stream_));
    upload_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    load_stats_printed_ = true;
    if (upload_bytes_ && std::getenv("QINFER_CUDA_VERBOSE"))
        std::fprintf(stderr, "%s: uploaded %.1f MiB of weights in %.3f s (%.2f GB/s); programmatic dependent launch %s\n",
                     name_.c_str(), double(upload_bytes_) / (1 << 20), upload_s_,
                     double(upload_bytes_) / 1e9 / upload_s_, cuda::pdl_enabled() ? "on" : "off");
}

void CudaBackend::write(const Tensor& dst, const void* src, size_t bytes, size_t offset) {
    check_ours(dst, "write");
    if (bytes == 0) return;
    if (in_keyed_) fail("CUDA: write() inside a recorded step");
    uint8_t* d = static_cast<uint8_t*>(dst.data) + offset;
    if (!deferring()) {
        QINFER_CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, stream_));
    } else {
        const uint8_t* p = static_cast<const uint8_t*>(src);
        payloads_.push_back(Payload{d, std::vector<uint8_t>(p, p + bytes)});
        sig(uint32_t(0x57), d, bytes);
        PendingOp op;
        op.payload = int(payloads_.size() - 1);
        pending_.push_back(std::move(op));
    }
    wrote(dst);
    chain_break();
}

void CudaBackend::read(const Tensor& src, void* dst, size_t bytes, size_t offset) {
    check_ours(src, "read");
    if (in_keyed_) fail("CUDA: read() inside a recorded step");
    chain_break();
    flush();
    if (bytes == 0) return;
    QINFER_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const uint8_t*>(src.data) + offset, bytes,
                                      cudaMemcpyDeviceToHost, stream_));
    QINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

uint64_t CudaBackend::read_async(const Tensor& src, size_t bytes, size_t offset) {
    check_ours(src, "read_async");
    if (in_keyed_) fail("CUDA: read_async() inside a recorded step");
    chain_break();
    flush();
    AsyncRead* slot = nullptr;
    for (AsyncRead& r : async_reads_)
        if (r.ticket == 0 && r.capacity >= bytes) slot = &r;
    if (!slot) {
        if (async_reads_.size() >= 16) fail("CUDA: more than 16 unfinished read_async()");
        AsyncRead r;
        r.capacity = std::max<size_t>(bytes, 256);
        QINFER_CUDA_CHECK(cudaMallocHost(&r.pinned, r.capacity));
        QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming));
        async_reads_.push_back(r);
        slot = &async_reads_.back();
    }
    if (bytes > 0)
        QINFER_CUDA_CHECK(cudaMemcpyAsync(slot->pinned, static_cast<const uint8_t*>(src.data) + offset, bytes,
                                          cudaMemcpyDeviceToHost, stream_));
    QINFER_CUDA_CHECK(cudaEventRecord(slot->done, stream_));
    slot->bytes = bytes;
    slot->ticket = next_read_ticket_++;
    return slot->ticket;
}

void CudaBackend::finish_read(uint64_t ticket, void* dst) {
    for (AsyncRead& r : async_reads_) {
        if (r.ticket != ticket || ticket == 0) continue;
        r.ticket = 0;  // free again, whatever happens below
        QINFER_CUDA_CHECK(cudaEventSynchronize(r.done));
        if (r.bytes > 0) std::memcpy(dst, r.pinned, r.bytes);
        return;
    }
    fail(strfmt("%s: no read with ticket %llu", name_.c_str(), (unsigned long long)ticket));
}

void CudaBackend::fill_zero(const Tensor& t) {
    check_ours(t, "fill_zero");
    void* p = t.data;
    const size_t n = t.nbytes();
    sig(uint32_t(0x46), p, n);
    enqueue([=, s = stream_] { QINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s)); });
    wrote(t);
    chain_break();
}

void CudaBackend::synchronize() {
    chain_break();
    flush();
    QINFER_CUDA_CHECK(cudaStreamSynchronize(upload_stream_));
    QINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_bytes(const Tensor& t, size_t dst_offset, size_t src_offset, size_t bytes) {
    check_ours(t, "copy_bytes");
    if (bytes == 0) return;
    uint8_t* base = static_cast<uint8_t*>(t.data);
    sig(uint32_t(0x43), base, dst_offset, src_offset, bytes);
    enqueue([=, s = stream_] {
        QINFER_CUDA_CHECK(cudaMemcpyAsync(base + dst_offset, base + src_offset, bytes, cudaMemcpyDeviceToDevice, s));
    });
    wrote(t);
    chain_break();
}

bool CudaBackend::written_in_chain(const void* p) const {
    return std::find(chain_written_.begin(), chain_written_.end(), p) != chain_written_.end();
}

void CudaBackend::chain_wrote(const void* p) {
    if (!written_in_chain(p)) chain_written_.push_back(p);
}

void CudaBackend::check_ours(const Tensor& t, const char* op) const {
    if (t.backend != this) fail(strfmt("CUDA %s: tensor '%s' does not live on %s", op, t.name, name_.c_str()));
}

// ---------------------------------------------------------------- activation cache

void CudaBackend::wrote(const Tensor& t) {
    const uint8_t* lo = static_cast<const uint8_t*>(t.data);
    const uint8_t* hi = lo + t.nbytes();
    for (ActCache& c : act_cache_) {
        if (!c.valid) continue;
        const uint8_t* xlo = static_cast<const uint8_t*>(c.x);
        const uint8_t* xhi = xlo + size_t(c.T - 1) * c.ldx * 4 + size_t(c.K) * 4;
        if (xlo < hi && lo < xhi) c.valid = false;
    }
}

cuda::ActQ CudaBackend::activations(GgmlType wt, const Tensor& x, int64_t K, int64_t T) {
    const cuda::ActKind kind = cuda::act_kind_for(wt);
    const float* xp = static_cast<const float*>(x.data);
    if (kind == cuda::ActKind::F32) return cuda::act_view(kind, nullptr, xp, K, T);
    const size_t ldx = x.nb[1] / 4;
    for (int i = 0; i < 2; ++i) {
        const ActCache& c = act_cache_[i];
        if (c.valid && c.x == x.data && c.K == K && c.T == T && c.ldx == ldx && c.kind == kind)
            return cuda::act_view(kind, act_buf_[i].p, xp, K, T);
    }
    const int i = act_next_;
    act_next_ ^= 1;
    // Both buffers grow together: which one an activation lands in depends on
    // the history, so the eager first run of a step must size both for the
    // recording that follows.
    const size_t need = cuda::act_bytes(kind, K, T);
    for (int j = 0; j < 2; ++j)
        if (need > act_buf_[j].bytes) {
            scratch(act_buf_[j], need, "activation");
            act_cache_[j].valid = false;  // its old buffer is gone
        }
    void* buf = act_buf_[i].p;
    sig(uint32_t(16), uint32_t(kind), xp, ldx, K, T, buf);
    enqueue([=, s = stream_] { cuda::quantize_act(kind, xp, int64_t(ldx), K, T, buf, s); });
    if (deferring()) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Quantize;
        op.dest = cuda::ActDest{kind, xp, int64_t(ldx), K, T, buf};
    }
    act_cache_[i] = ActCache{x.data, K, T, ldx, kind, true};
    return cuda::act_view(kind, buf, xp, K, T);
}

// A quantized weight of prompt products, dequantized to f16 once and kept, so
// that a prompt step multiplies straight away instead of dequantizing every
// weight again (a third of a 512-token step on an H200: pp512 19.8k -> 28.7k
// with Qwen3.5-4B Q4_K_M, for 6.65 GiB of copies). Memory that would sit
// idle pays for it: the copy is made when, after it, a quarter of the device
// (and of --vram-limit) stays free, else the weight keeps the per-step path.
// QINFER_CUDA_F16_COPY=0 never makes copies, =1 makes them while allocation
// succeeds. Same products either way: the same f16 values reach cuBLAS.
bool CudaBackend::f16_copy_fits(size_t bytes) const {
    const int mode = env_int("QINFER_CUDA_F16_COPY", 0, 1, -1);
    if (mode >= 0) return mode == 1;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (free_b < bytes || free_b - bytes < total_b / 4) return false;
    return limit_ == 0 || in_use_ + bytes + limit_ / 4 <= limit_;
}

const void* CudaBackend::f16_copy(const cuda::DeviceWeight& dw) {
    auto it = weights_.find(dw.data);
    if (it == weights_.end() || !it->second.resident) return nullptr;
    WeightInfo& wi = it->second;
    if (wi.f16 || wi.f16_declined || capturing_) return wi.f16;
    const size_t bytes = wi.f16_bytes();
    if (!f16_copy_fits(bytes)) {
        wi.f16_declined = true;
        return nullptr;
    }
    try {
        wi.f16 = device_malloc(bytes, "f16 copy of a weight");
    } catch (const Error&) {
        wi.f16_declined = true;  // out of memory: the per-step path needs none of it
        return nullptr;
    }
    // Launched now, ahead of the queued ops: it reads only the weight, and the
    // products that read the copy are queued after it on the same stream.
    cuda::dequant_f16(dw, 0, dw.N, wi.f16, stream_);
    return wi.f16;
}

// ---------------------------------------------------------------- ops

cuda::DeviceWeight CudaBackend::device_weight(const Tensor& w) const {
    auto it = weights_.find(w.data);
    if (it != weights_.end()) {
        if (it->second.dw.type != w.type || it->second.dw.K != w.ne[0] || it->second.dw.N != w.n_rows())
            fail(strfmt("CUDA: weight '%s' is used with a shape or type other than it was uploaded with", w.name));
        return it->second.dw;
    }
    // Plain tensors allocated with alloc() (activations, test data): usable when
    // their type needs no repacking and their rows are contiguous.
    const cuda::WeightLayout l = cuda::weight_layout(w.type, w.n_elements() / traits(w.type).block_size);
    if (l.repacked || !w.is_contiguous())
        fail(strfmt("CUDA: '%s' (%s) was not uploaded with upload_weight and cannot be used as a weight", w.name,
                    type_name(w.type)));
    cuda::DeviceWeight dw;
    dw.type = w.type;
    dw.K = w.ne[0];
    dw.N = w.n_rows();
    dw.data = static_cast<const uint8_t*>(w.data);
    dw.layout = l;
    return dw;
}

void CudaBackend::get_rows(const Tensor& w, const Tensor& ids, const Tensor& out) {
    check_ours(w, "get_rows");
    check_ours(ids, "get_rows");
    const int64_t T = ids.ne[0];
    if (ids.type != GgmlType::I32 || out.ne[0] != w.ne[0] || out.ne[1] != T || out.type != GgmlType::F32)
        fail(strfmt("CUDA get_rows %s: ids %s, out %s do not fit", w.name, shape_str(ids).c_str(),
                    shape_str(out).c_str()));
    const cuda::DeviceWeight dw = device_weight(w);
    const int32_t* ip = static_cast<const int32_t*>(ids.data);
    float* op = static_cast<float*>(out.data);
    const int64_t ldo = int64_t(out.nb[1] / 4);
    sig(uint32_t(1), dw.data, dw.K, dw.N, uint32_t(dw.type), ip, T, op, ldo);
    enqueue([=, s = stream_] { cuda::get_rows(dw, ip, T, op, ldo, s); });
    wrote(out);
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias) {
    check_ours(w, "matmul");
    check_ours(x, "matmul");
    check_ours(y, "matmul");
    const int64_t K = w.ne[0], N = w.n_rows(), T = x.ne[1];
    if (x.ne[0] != K || y.ne[0] != N || y.ne[1] != T || x.type != GgmlType::F32 || y.type != GgmlType::F32 ||
        x.nb[1] != size_t(K) * 4 || y.nb[0] != 4)
        fail(strfmt("CUDA matmul %s %s: x %s, y %s do not fit", w.name, shape_str(w).c_str(), shape_str(x).c_str(),
                    shape_str(y).c_str()));
    const float* b = nullptr;
    if (bias && *bias) {
        if (bias->type != GgmlType::F32 || bias->ne[0] != N) fail(strfmt("CUDA matmul %s: bias does not fit", w.name));
        b = static_cast<const float*>(bias->data);
    }
    const cuda::DeviceWeight dw = device_weight(w);
    float* yp = static_cast<float*>(y.data);
    const float* xp = static_cast<const float*>(x.data);
    const int64_t ldy = int64_t(y.nb[1] / 4);
    const bool half = w.type == GgmlType::F16 || w.type == GgmlType::BF16 || w.type == GgmlType::F32;
    // Quantized weights: up to kVecMaxT tokens the matvec kernel; decode batches
    // (below kF16MinTokens) the int8 tensor-core kernels (mma), whose rows equal
    // the matvec's; prompt steps of kF16MinTokens or more dequantize the weight
    // to f16 for cuBLAS with f16 activations: 1.5x faster at T = 512 on an H200,
    // at the price of rounding that depends on the step's size (a prompt's
    // logits differ slightly with its chunking; bench/results/cuda-h200.md).
    // Products of fewer than kF16MinRows rows stay on mma. QINFER_CUDA_PREFILL=vec|mma|f16
    // forces one path for every product above kVecMaxT tokens (=mma: the int8
    // kernels for prompts too, whose rounding does not depend on the chunking).
    const char* prefill = std::getenv("QINFER_CUDA_PREFILL");
    constexpr int64_t kVecMaxT = 8;  // (the f16 thresholds: runtime/cuda/sizing.h, counted by the planner)
    const bool forced = prefill && *prefill;
    const bool f16_prefill =
        forced ? std::strcmp(prefill, "f16") == 0 : T >= cuda::kF16MinTokens && N >= cuda::kF16MinRows;
    // (scratch growth may flush the queue: signatures are added after it)
    if (T > kVecMaxT && (half || f16_prefill)) {
        // cuBLAS. F32 / F16 / BF16 weights: f32 products of the exact weights and
        // the f32 activations (the CPU backend's semantics): half weights are
        // widened to f32 in row chunks, then SGEMM. Quantized weights: dequantized
        // to f16 and multiplied with f16 activations (f32 accumulation): other
        // rounding than the CPU's 8-bit activations, closer to the f32 product.
        // Weights go through a scratch of at most kF16WeightChunkBytes, in row
        // chunks when larger (QINFER_CUDA_F16_CHUNK_KB lowers it for tests).
        cublasHandle_t h = static_cast<cublasHandle_t>(cublas_);
        const int64_t chunk_bytes =
            int64_t(env_int("QINFER_CUDA_F16_CHUNK_KB", 16, int(cuda::kF16WeightChunkBytes >> 10),
                            int(cuda::kF16WeightChunkBytes >> 10)))
            << 10;
        const int64_t elem = half ? 4 : 2;
        const int64_t chunk = w.type == GgmlType::F32
                                  ? N
                                  : std::max<int64_t>(1, std::min<int64_t>(N, chunk_bytes / (elem * K)));
        void* hw = nullptr;
        void* hx = nullptr;
        const void* copy = half ? nullptr : f16_copy(dw);
        if (!half) {
            hw = copy ? nullptr : scratch(half_w_, size_t(chunk * K) * 2, "f16 weight");
            hx = scratch(half_x_, size_t(T * K) * 2, "f16 activation");
        } else if (w.type != GgmlType::F32) {
            hw = scratch(half_w_, size_t(chunk * K) * 4, "f32 weight chunk");
        }
        sig(uint32_t(2), dw.data, dw.K, dw.N, uint32_t(dw.type), xp, T, yp, ldy, b, hw, hx, chunk, copy);
        if (profile_)
            next_label_ = strfmt("matmul %s %lldx%lld T=%lld cublas%s", type_name(w.type), (long long)K, (long long)N,
                                 (long long)T, copy ? " (f16 copy)" : "");
        const cudaStream_t st = stream_;
        enqueue([=] {
            const float one = 1.f, zero = 0.f;
            if (half) {
                for (int64_t n0 = 0; n0 < N; n0 += chunk) {
                    const int64_t nc = std::min(chunk, N - n0);
                    const float* wp = reinterpret_cast<const float*>(dw.data) + n0 * K;
                    if (dw.type != GgmlType::F32) {
                        cuda::dequant_f32(dw, n0, nc, static_cast<float*>(hw), st);
                        wp = static_cast<const float*>(hw);
                    }
                    QINFER_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(nc), int(T), int(K), &one, wp,
                                                    int(K), xp, int(K), &zero, yp + n0, int(ldy)));
                }
            } else {
                cuda::convert_rows(xp, K, K, T, GgmlType::F16, hx, st);
                const int64_t step = copy ? N : chunk;
                for (int64_t n0 = 0; n0 < N; n0 += step) {
                    const int64_t nc = std::min(step, N - n0);
                    const void* wp = copy;
                    if (!copy) {
                        cuda::dequant_f16(dw, n0, nc, hw, st);
                        wp = hw;
                    }
                    QINFER_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(nc), int(T), int(K), &one, wp,
                                                     CUDA_R_16F, int(K), hx, CUDA_R_16F, int(K), &zero, yp + n0,
                                                     CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                }
            }
            if (b) {
                Rows yr;
                yr.data = yp;
                yr.n = N;
                yr.n1 = T;
                yr.s1 = ldy;
                cuda::add(yr, bias_rows(b, N, T), yr, st);
            }
        });
    } else {
        const cuda::ActQ act = activations(w.type, x, K, T);
        const bool use_mma = T > kVecMaxT && !(forced && std::strcmp(prefill, "vec") == 0);
        sig(uint32_t(2), dw.data, dw.K, dw.N, uint32_t(dw.type), xp, T, yp, ldy, b, act.qs, act.half, use_mma);
        if (profile_)
            next_label_ = strfmt("matmul %s %lldx%lld T=%lld %s", type_name(w.type), (long long)K, (long long)N,
                                 (long long)T, use_mma && cuda::mma_applies(N, T) ? "mma" : "vec");
        enqueue([=, s = stream_] {
            if (!use_mma || !cuda::matmul_mma(dw, act, T, yp, ldy, b, s)) cuda::matmul_vec(dw, act, T, yp, ldy, b, s);
        });
        if (deferring() && T <= kVecMaxT && cuda::matvec_multi_supports(w.type)) {
            PendingOp& op = pending_.back();
            op.kind = PendingOp::Matvec;
            op.mv.w = dw;
            op.mv.y = yp;
            op.mv.ldy = ldy;
            op.mv.bias = b;
            op.act = act;
            op.T = T;
        }
    }
    wrote(y);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    check_ours(x, "rms_norm");
    if (w.ne[0] != x.ne[0] || w.type != GgmlType::F32)
        fail(strfmt("CUDA rms_norm: weight %s does not match rows of %lld", w.name, (long long)x.ne[0]));
    const Rows xr = rows_of(x, "rms_norm"), yr = rows_of(y, "rms_norm");
    const float* wp = static_cast<const float*>(w.data);
    sig(uint32_t(3), xr, wp, eps, yr);
    enqueue([=, s = stream_] { cuda::rms_norm(xr, wp, eps, yr, s); });
    if (deferring()) tag_norm(cuda::NormJob{cuda::NormOp::Rms, xr, xr, yr, wp, eps});
    wrote(y);
}

void CudaBackend::tag_norm(const cuda::NormJob& j) {
    PendingOp& op = pending_.back();
    op.kind = PendingOp::Norm;
    op.norm = j;
}

void CudaBackend::l2_norm(const Tensor& x, float eps, const Tensor& y) {
    check_ours(x, "l2_norm");
    const Rows xr = rows_of(x, "l2_norm"), yr = rows_of(y, "l2_norm");
    sig(uint32_t(4), xr, eps, yr);
    enqueue([=, s = stream_] { cuda::l2_norm(xr, eps, yr, s); });
    if (deferring()) tag_norm(cuda::NormJob{cuda::NormOp::L2, xr, xr, yr, nullptr, eps});
    wrote(y);
}

void CudaBackend::rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps, const Tensor& y) {
    check_ours(x, "rms_norm_gated");
    if (w.ne[0] != x.ne[0] || w.type != GgmlType::F32)
        fail(strfmt("CUDA rms_norm_gated: weight %s does not match rows of %lld", w.name, (long long)x.ne[0]));
    const Rows xr = rows_of(x, "rms_norm_gated"), zr = rows_of(z, "rms_norm_gated"), yr = rows_of(y, "rms_norm_gated");
    const float* wp = static_cast<const float*>(w.data);
    sig(uint32_t(5), xr, wp, zr, eps, yr);
    enqueue([=, s = stream_] { cuda::rms_norm_gated(xr, wp, zr, eps, yr, s); });
    if (deferring()) tag_norm(cuda::NormJob{cuda::NormOp::RmsGated, xr, zr, yr, wp, eps});
    wrote(y);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
    check_ours(a, "add");
    const Rows ar = rows_of(a, "add"), br = rows_of(b, "add"), yr = rows_of(y, "add");
    sig(uint32_t(6), ar, br, yr);
    enqueue([=, s = stream_] { cuda::add(ar, br, yr, s); });
    if (deferring()) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Add;
        op.a = ar;
        op.b = br;
        op.y = yr;
    }
    wrote(y);
}

// swiglu and sigmoid_mul: elementwise gates that the activation quantization
// of a following matmul may absorb (PendingOp::Gate).
void CudaBackend::gate_op(cuda::Gate g, const Tensor& a, const Tensor& b, const Tensor& y, const char* what) {
    check_ours(a, what);
    const Rows ar = rows_of(a, what), br = rows_of(b, what), yr = rows_of(y, what);
    const bool swiglu = g == cuda::Gate::Swiglu;
    sig(uint32_t(swiglu ? 7 : 8), ar, br, yr);
    enqueue([=, s = stream_] {
        if (swiglu) cuda::swiglu(ar, br, yr, s);
        else cuda::sigmoid_mul(ar, br, yr, s);
    });
    if (deferring()) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Gate;
        op.gate = g;
        op.a = ar;
        op.b = br;
        op.y = yr;
    }
    wrote(y);
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& y) {
    gate_op(cuda::Gate::Swiglu, gate, up, y, "swiglu");
}

void CudaBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y) {
    gate_op(cuda::Gate::SigmoidMul, x, gate, y, "sigmoid_mul");
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
    check_ours(src, "copy");
    check_ours(dst, "copy");
    if (src.type == GgmlType::F32 && dst.type == GgmlType::F32) {
        const Rows sr = rows_of(src, "copy"), dr = rows_of(dst, "copy");
        sig(uint32_t(9), sr, dr);
        enqueue([=, s = stream_] { cuda::copy_rows(sr, dr, s); });
        chain_wrote(dst.data);
    } else {
        if (src.type != dst.type || !src.is_contiguous() || !dst.is_contiguous() || src.nbytes() != dst.nbytes())
            fail(strfmt("CUDA copy %s -> %s: types or layouts differ", src.name, dst.name));
        void* d = dst.data;
        const void* sp = src.data;
        const size_t n = src.nbytes();
        sig(uint32_t(10), d, sp, n);
        enqueue([=, s = stream_] { QINFER_CUDA_CHECK(cudaMemcpyAsync(d, sp, n, cudaMemcpyDeviceToDevice, s)); });
        chain_break();
    }
    wrote(dst);
}

void CudaBackend::rope_neox(const Tensor& x, const StepInfo& step, int n_rot, float base, float freq_scale) {
    check_ours(x, "rope");
    if (x.ne[2] != step.n_tokens || x.ne[3] != 1)
        fail(strfmt("CUDA rope: %s %s does not fit %d tokens", x.name, shape_str(x).c_str(), step.n_tokens));
    const Rows xr = rows_of(x, "rope");
    const int32_t* pos = static_cast<const int32_t*>(step.pos_t.data);
    sig(uint32_t(11), xr, pos, n_rot, base, freq_scale);
    enqueue([=, s = stream_] { cuda::rope_neox(xr, pos, n_rot, base, freq_scale, s); });
    if (deferring()) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Rope;
        op.rope = cuda::RopeJob{xr, pos, n_rot, base, freq_scale};
    }
    wrote(x);
}

namespace {
// cuda::attention's `fresh`: the widest span of positions one slot has in the
// step's segments (rows below a token's position + 1 - fresh were written by
// earlier steps; a slot is normally one segment). 0 with QINFER_CUDA_ATTN_EARLY=0:
// the split kernel loads nothing before it waits (A/B).
int fresh_rows(const StepInfo& step) {
    static const bool early = env_int("QINFER_CUDA_ATTN_EARLY", 0, 1, 1) != 0;
    if (!early) return 0;
    int fresh = 0;
    for (const StepInfo::Segment& a : step.segments) {
        int32_t lo = a.pos0, hi = a.pos0 + a.count - 1;
        for (const StepInfo::Segment& b : step.segments)
            if (b.slot == a.slot) {
                lo = std::min(lo, b.pos0);
                hi = std::max(hi, b.pos0 + b.count - 1);
            }
        fresh = std::max(fresh, hi - lo + 1);
    }
    return fresh;
}
}  // namespace

bool CudaBackend::supports_kv_type(GgmlType t) const {
    return t == GgmlType::F16 || t == GgmlType::F32 || t == GgmlType::Q8_0;
}

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const KvCache& cache,
                            const StepInfo& step, float scale, const Tensor& out) {
    check_ours(q, "attention");
    check_ours(cache.k, "attention");
    const int64_t d = q.ne[0], n_head = q.ne[1], T = q.ne[2], n_kv = k.ne[1];
    const Tensor& K = cache.k;
    if (T != step.n_tokens || k.ne[0] != d || v.ne[0] != d || v.ne[1] != n_kv || k.ne[2] != T || v.ne[2] != T ||
        K.ne[0] != d || K.ne[1] != n_kv || n_head % n_kv != 0 || out.ne[0] != d || out.ne[1] != n_head ||
        out.ne[2] != T || !out.is_contiguous() || cache.v.type != K.type || !supports_kv_type(K.type) ||
        d % traits(K.type).block_size != 0)
        fail(strfmt("CUDA attention: q %s, k %s, v %s, cache %s, out %s do not fit", shape_str(q).c_str(),
                    shape_str(k).c_str(), shape_str(v).c_str(), shape_str(K).c_str(), shape_str(out).c_str()));
    for (int64_t t = 0; t < T; ++t) {
        const int32_t p = step.pos[size_t(t)], s = step.slot[size_t(t)];
        if (p < 0 || p >= K.ne[2] || s < 0 || s >= K.ne[3])
            fail(strfmt("CUDA attention: position %d / slot %d outside the cache %s", p, s, shape_str(K).c_str()));
    }
    cuda::KvView kv;
    kv.k = K.data;
    kv.v = cache.v.data;
    kv.type = K.type;
    kv.d = d;
    kv.n_kv = n_kv;
    kv.n_ctx = K.ne[2];
    kv.n_slots = K.ne[3];
    const int32_t* pos = static_cast<const int32_t*>(step.pos_t.data);
    const int32_t* slot = static_cast<const int32_t*>(step.slot_t.data);
    const Rows qr = rows_of(q, "attention"), kr = rows_of(k, "attention"), vr = rows_of(v, "attention");
    // rows of earlier steps load early only where no kernel of the chain wrote the cache
    const bool cache_before_chain = !written_in_chain(kv.k) && !written_in_chain(kv.v);
    const int max_len = step.max_segment_len(), fresh = cache_before_chain ? fresh_rows(step) : 0;
    const cuda::Segment* seg = static_cast<const cuda::Segment*>(step.seg_t.data);
    const int n_seg = int(step.segments.size());
    const size_t wb = cuda::attention_work_bytes(T, n_head, d, kv.n_ctx, max_len);
    void* work = wb ? scratch(attn_work_, wb, "attention") : nullptr;
    float* op = static_cast<float*>(out.data);
    sig(uint32_t(12), qr, kr, vr, kv.k, kv.v, kv.type, d, n_kv, kv.n_ctx, kv.n_slots, pos, slot, T, scale, op, work,
        max_len, seg, n_seg, fresh);
    auto attend = [=, s = stream_](const cuda::AttnQuant* quant) {
        return cuda::attention(qr, kv, pos, slot, T, scale, op, work, max_len, s, seg, n_seg, fresh, quant);
    };
    enqueue([=, s = stream_] {
        cuda::kv_store(kr, vr, kv, pos, slot, T, s);
        attend(nullptr);
    });
    // the store may move into the q / k norm + rope launch, the quantization of
    // the output into the attention's (run_pending)
    if (deferring()) {
        PendingOp& po = pending_.back();
        po.kind = PendingOp::Attention;
        po.kv_store = cuda::KvStoreJob{kr, vr, kv, pos, slot};
        po.kv_T = T;
        po.run_attention = attend;
    }
    chain_wrote(kv.k);
    chain_wrote(kv.v);
    wrote(cache.k);
    wrote(cache.v);
    wrote(out);
}

void CudaBackend::conv1d_silu(const Tensor& x, const Tensor& w, const RecurrentState& state, const StepInfo& step,
                              const Tensor& out) {
    check_ours(x, "conv1d");
    check_ours(state.conv, "conv1d");
    const int64_t C = x.ne[0], T = x.ne[1], K = w.ne[0];
    const Tensor& cs = state.conv;
    if (T != step.n_tokens || w.ne[1] != C || cs.ne[0] != C || cs.ne[1] != K - 1 || out.ne[0] != C ||
        out.ne[1] != T || w.type != GgmlType::F32 || !w.is_contiguous() || !cs.is_contiguous())
        fail(strfmt("CUDA conv1d: x %s, w %s, state %s, out %s do not fit", shape_str(x).c_str(),
                    shape_str(w).c_str(), shape_str(cs).c_str(), shape_str(out).c_str()));
    const Rows xr = rows_of(x, "conv1d"), orr = rows_of(out, "conv1d");
    const float* wp = static_cast<const float*>(w.data);
    float* sp = static_cast<float*>(cs.data);
    const int n_slots = int(cs.ne[2]), n_seg = int(step.segments.size()), Ki = int(K);
    const cuda::Segment* seg = static_cast<const cuda::Segment*>(step.seg_t.data);
    const int max_len = step.max_segment_len();
    sig(uint32_t(13), xr, orr, wp, sp, n_slots, n_seg, Ki, C, seg, max_len);
    enqueue([=, s = stream_] {
        cuda::conv1d_silu(xr.data, xr.s1, wp, Ki, C, sp, n_slots, seg, n_seg, max_len, orr.data, orr.s1, s);
    });
    if (deferring() && n_seg == 1 && max_len == 1 && T == 1) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Conv;
        op.conv = cuda::ConvAfter{wp, Ki, sp, seg, orr.data};
        op.conv_x = xr.data;
        op.conv_C = C;
    }
    wrote(cs);
    wrote(out);
}

void CudaBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a,
                                   const Tensor& b, const Tensor& dt_bias, const Tensor& ssm_a,
                                   const RecurrentState& state, const StepInfo& step, const Tensor& out) {
    check_ours(q, "gated_delta_rule");
    check_ours(state.S, "gated_delta_rule");
    const int64_t dk = q.ne[0], Hk = q.ne[1], T = q.ne[2];
    const int64_t dv = v.ne[0], Hv = v.ne[1];
    const Tensor& S = state.S;
    if (T != step.n_tokens || k.ne[0] != dk || k.ne[1] != Hk || v.ne[2] != T || Hv % Hk != 0 || a.ne[0] != Hv ||
        b.ne[0] != Hv || S.ne[0] != dk || S.ne[1] != dv || S.ne[2] != Hv || out.ne[0] != dv || out.ne[1] != Hv ||
        !out.is_contiguous() || !S.is_contiguous())
        fail(strfmt("CUDA gated_delta_rule: q %s, v %s, state %s, out %s do not fit", shape_str(q).c_str(),
                    shape_str(v).c_str(), shape_str(S).c_str(), shape_str(out).c_str()));
    const Rows qr = rows_of(q, "gdr"), kr = rows_of(k, "gdr"), vr = rows_of(v, "gdr");
    const Rows ar = rows_of(a, "gdr"), br = rows_of(b, "gdr");
    cuda::DeltaArgs p{};
    p.q = qr.data;
    p.k = kr.data;
    p.v = vr.data;
    p.q_h = qr.s1;
    p.q_t = qr.s2;
    p.k_h = kr.s1;
    p.k_t = kr.s2;
    p.v_h = vr.s1;
    p.v_t = vr.s2;
    p.a = ar.data;
    p.b = br.data;
    p.a_t = ar.s1;
    p.b_t = br.s1;
    p.dt_bias = static_cast<const float*>(dt_bias.data);
    p.ssm_a = static_cast<const float*>(ssm_a.data);
    p.S = static_cast<float*>(S.data);
    p.out = static_cast<float*>(out.data);
    p.dk = int(dk);
    p.dv = int(dv);
    p.Hk = int(Hk);
    p.Hv = int(Hv);
    // written before the chain: the kernel loads it before its wait (QINFER_CUDA_GDR_EARLY=0: after, A/B)
    static const bool state_early = env_int("QINFER_CUDA_GDR_EARLY", 0, 1, 1) != 0;
    p.state_early = state_early && !written_in_chain(p.S);
    chain_wrote(p.S);
    const int max_len = step.max_segment_len();
    const int n_seg = int(step.segments.size());
    const cuda::Segment* seg = static_cast<const cuda::Segment*>(step.seg_t.data);
    sig(uint32_t(14), p, n_seg, max_len, seg);
    enqueue([=, s = stream_] { cuda::gated_delta_rule(p, seg, n_seg, max_len, s); });
    if (deferring() && cuda::gdr_all_serial(p, max_len)) {
        PendingOp& op = pending_.back();
        op.kind = PendingOp::Gdr;
        op.gdr = p;
        op.gdr_seg = seg;
        op.gdr_n_seg = n_seg;
        op.gdr_max_len = max_len;
    }
    wrote(S);
    wrote(out);
}

void CudaBackend::argmax(const Tensor& logits, const Tensor& ids) {
    check_ours(logits, "argmax");
    check_ours(ids, "argmax");
    const int64_t V = logits.ne[0], T = logits.ne[1];
    if (ids.type != GgmlType::I32 || ids.ne[0] < T || logits.type != GgmlType::F32)
        fail(strfmt("CUDA argmax: logits %s / ids %s do not fit", shape_str(logits).c_str(), shape_str(ids).c_str()));
    const float* lp = static_cast<const float*>(logits.data);
    const int64_t ld = int64_t(logits.nb[1] / 4);
    int32_t* ip = static_cast<int32_t*>(ids.data);
    sig(uint32_t(15), lp, ld, V, T, ip);
    enqueue([=, s = stream_] { cuda::argmax_rows(lp, ld, V, T, ip, s); });
    wrote(ids);
}

void CudaBackend::top_k(const Tensor& logits, const Tensor& values, const Tensor& ids) {
    check_ours(logits, "top_k");
    check_ours(values, "top_k");
    check_ours(ids, "top_k");
    check_top_k_shapes(logits, values, ids);
    const int64_t V = logits.ne[0], T = logits.ne[1];
    const int k = int(values.ne[0]);
    const size_t wb = cuda::top_k_work_bytes(V, T, k);
    if (wb == 0) fail(strfmt("CUDA top_k: k = %d of %lld logits (at most 256)", k, (long long)V));
    void* work = scratch(top_k_work_, wb, "top_k");
    const float* lp = static_cast<const float*>(logits.data);
    const int64_t ld = int64_t(logits.nb[1] / 4);
    float* vp = static_cast<float*>(values.data);
    int32_t* ip = static_cast<int32_t*>(ids.data);
    sig(uint32_t(17), lp, ld, V, T, k, vp, ip, work);
    enqueue([=, s = stream_] { cuda::top_k_rows(lp, ld, V, T, k, vp, ip, work, s); });
    wrote(values);
    wrote(ids);
}

// ---------------------------------------------------------------- deferred execution and graphs

void CudaBackend::enqueue(std::function<void()> fn) {
    if (!deferring()) {
        print_load_stats_once();
        fn();
        return;
    }
    if (pending_.size() >= 16384 && !in_keyed_) flush();  // bound the queue (before: callers tag back())
    // An unrecorded step (begin_graph(key, false)) starts on the GPU while it is
    // still being issued, in runs of ~48 ops cut where no fusion pattern spans
    // the cut: otherwise the GPU would wait for the host to queue the whole
    // step (~1 ms for a prompt chunk of the 4B model).
    if (in_keyed_ && keyed_eager_ && pending_.size() >= 48) {
        const PendingOp::Kind last = pending_.back().kind;
        if (last == PendingOp::Opaque || last == PendingOp::Add || last == PendingOp::Quantize ||
            last == PendingOp::Conv || last == PendingOp::Gdr || last == PendingOp::Attention) {
            run_pending(nullptr);
            pending_.clear();
            payloads_.clear();
        }
    }
    PendingOp op;
    op.run = std::move(fn);
    op.code = last_op_code();
    if (profile_) {
        op.label = next_label_.empty() ? profile_label() : next_label_;
        next_label_.clear();
    }
    pending_.push_back(std::move(op));
}

void CudaBackend::drop_graphs() {
    for (auto& kv : auto_graphs_) destroy_graph(kv.second);
    for (auto& kv : keyed_graphs_) destroy_graph(kv.second);
    auto_graphs_.clear();
    keyed_graphs_.clear();
}

void CudaBackend::destroy_graph(GraphRec& g) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    if (g.done) cudaEventDestroy(g.done);
    for (void* p : g.pinned) cudaFreeHost(p);
    g = GraphRec{};
}

// Runs the queue on the stream; writes come from `pinned` (capture) or from
// their own host copies (eager).
//
// Peephole fusion on the way: adjacent quantized matvecs over the same
// activations become one launch, and an add that consumes the last one's
// output right after it becomes its epilogue (both outputs still written, so
// the result is the same as running the ops one by one). A norm, swiglu or
// sigmoid_mul whose output rows are exactly what the activation quantization
// right after it reads is computed inside that quantization (its output still
// written; the quants bit-identical to the two ops one by one), and two
// adjacent independent norms of one shape (q and k heads) share a launch.
// Whether pending ops i .. i + 7 are ffn_block for one token -- rms_norm,
// its quantization, the gate and up products of it, swiglu, its quantization,
// the down product, the residual add -- that cuda::ffn_decode takes (then in
// ffn_job_).
bool CudaBackend::try_ffn(size_t i) {
    const PendingOp* p = &pending_[i];
    using K = PendingOp::Kind;
    const K want[8] = {K::Norm, K::Quantize, K::Matvec, K::Matvec, K::Gate, K::Quantize, K::Matvec, K::Add};
    for (int k = 0; k < 8; ++k)
        if (p[k].kind != want[k]) return false;
    if (p[4].gate != cuda::Gate::Swiglu) return false;
    auto quant_of = [](const PendingOp& q) {
        const cuda::ActDest& d = q.dest;
        return cuda::act_view(d.kind, d.buf, d.x, d.K, d.T).qs;
    };
    // the products read the quantizations just made, one token each
    if (p[2].act.qs != quant_of(p[1]) || p[3].act.qs != quant_of(p[1]) || p[6].act.qs != quant_of(p[5]) ||
        p[2].T != 1 || p[3].T != 1 || p[6].T != 1)
        return false;
    // the add: x + down -> y, where the down product's output is b (the residual epilogue's form)
    const cuda::Rows &a = p[7].a, &b = p[7].b, &y = p[7].y;
    const int64_t E = p[6].mv.w.N;
    auto vec = [&](const cuda::Rows& r) { return r.n == E && r.n1 * r.n2 == 1; };
    if (b.data != p[6].mv.y || !vec(a) || !vec(b) || !vec(y) || a.data == p[2].mv.y || a.data == p[3].mv.y)
        return false;
    cuda::FfnJob& f = ffn_job_;
    f = cuda::FfnJob{};
    f.norm = p[0].norm;
    f.act_h = p[1].dest;
    f.gate = p[2].mv;
    f.up = p[3].mv;
    f.ga = p[4].a;
    f.ub = p[4].b;
    f.s = p[4].y;
    f.act_s = p[5].dest;
    f.down = p[6].mv;
    f.down.res = a.data;
    f.down.res_out = y.data;
    f.down.ld_res = f.down.ld_res_out = E;
    f.barrier = static_cast<unsigned*>(ffn_barrier_.p);
    return cuda::ffn_decode_fits(f);
}

void CudaBackend::run_pending(const std::vector<void*>* pinned) {
    // QINFER_CUDA_SKIP_OPS what-ifs: the skipped ops leave the queue before the
    // fusions look at it, so an op is gone with whatever launch it would have
    // joined (the delta rule with the l2 norms it takes over, say), and its
    // neighbours fuse as they would without it.
    if (!skip_ops_.empty())
        pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                      [&](const PendingOp& o) {
                                          return o.payload < 0 && std::find(skip_ops_.begin(), skip_ops_.end(),
                                                                            o.code) != skip_ops_.end();
                                      }),
                       pending_.end());
    const size_t n = pending_.size();
    // Profiling: the stream is held while a run of up to kHeld ops is queued
    // with an event before and after each, so the events time the kernels
    // themselves, not the host's launch gaps.
    constexpr int kHeld = 96;
    const bool prof = profile_ && !pinned;
    std::vector<std::string> labels;
    int held = 0;
    auto release = [&] {
        *static_cast<volatile int*>(hold_flag_) = hold_value_;
        held = 0;
    };
    auto before = [&](const std::string& label) {
        if (!prof) return;
        if (held == 0) cuda::hold_until(hold_flag_dev_, ++hold_value_, stream_);
        const size_t k = 2 * labels.size();
        while (profile_events_.size() < k + 2) {
            cudaEvent_t e;
            QINFER_CUDA_CHECK(cudaEventCreate(&e));
            profile_events_.push_back(e);
        }
        QINFER_CUDA_CHECK(cudaEventRecord(profile_events_[k], stream_));
        labels.push_back(label);
    };
    auto after = [&] {
        if (!prof) return;
        QINFER_CUDA_CHECK(cudaEventRecord(profile_events_[2 * labels.size() - 1], stream_));
        if (++held == kHeld) release();
    };
    struct ReleaseOnExit {  // never leave the stream held (an op may throw)
        std::function<void()> f;
        ~ReleaseOnExit() { f(); }
    } release_on_exit{[&] { if (prof) release(); }};
    for (size_t i = 0; i < n;) {
        const PendingOp& op = pending_[i];
        if (op.payload >= 0) {
            const Payload& p = payloads_[size_t(op.payload)];
            const void* src = pinned ? (*pinned)[size_t(op.payload)] : p.data.data();
            // A copy from pageable memory returns only once it ran: never queue
            // it behind a held stream (untimed).
            if (prof && held) release();
            QINFER_CUDA_CHECK(cudaMemcpyAsync(p.dst, src, p.data.size(), cudaMemcpyHostToDevice, stream_));
            ++i;
            continue;
        }
        // a decode delta rule at k (its args `g`), then the gated norm of its output and
        // the quantization of that for the next product: one launch
        auto gdr_norm_at = [&](size_t k, const cuda::DeltaArgs& g) {
            return fuse_gdr_norm_ && k + 2 < n && pending_[k + 1].kind == PendingOp::Norm &&
                   pending_[k + 2].kind == PendingOp::Quantize &&
                   cuda::gdr_norm_fits(g, pending_[k].gdr_max_len, pending_[k + 1].norm, pending_[k + 2].dest);
        };
        auto run_gdr_norm = [&](size_t k, const cuda::DeltaArgs& g, const std::string& label) {
            const PendingOp& go = pending_[k];
            if (prof) before(label + " + " + pending_[k + 1].label + " + " + pending_[k + 2].label);
            cuda::gated_delta_rule_norm(g, go.gdr_seg, go.gdr_n_seg, pending_[k + 1].norm, pending_[k + 2].dest,
                                        stream_);
            after();
            fused_producers_ += 2;
        };
        if (op.kind == PendingOp::Gdr && gdr_norm_at(i, op.gdr)) {
            run_gdr_norm(i, op.gdr, "fused: " + op.label);
            i += 3;
            continue;
        }
        // the attention at k, then the quantization of its output (after the sigmoid
        // gate) for the next product, which its merge launch may take over: the
        // ops that launch runs, and whether it did
        auto run_attention_at = [&](size_t k, const std::string& label) -> size_t {
            const PendingOp& at = pending_[k];
            cuda::AttnQuant quant;
            size_t used = 0;
            auto is = [&](size_t j, PendingOp::Kind kind) {
                return j < n && pending_[j].kind == kind;
            };
            if (fuse_attn_quant_ && is(k + 1, PendingOp::Gate) && pending_[k + 1].gate == cuda::Gate::SigmoidMul &&
                is(k + 2, PendingOp::Quantize)) {
                const PendingOp& g = pending_[k + 1];
                quant = cuda::AttnQuant{true, g.a, g.b, g.y, pending_[k + 2].dest};
                used = 2;
            } else if (fuse_attn_quant_ && is(k + 1, PendingOp::Quantize)) {
                quant.q = pending_[k + 1].dest;
                used = 1;
            }
            std::string full = label;
            for (size_t j = k + 1; j <= k + used; ++j) full += " + " + pending_[j].label;
            if (prof) before(used ? full + " (if split)" : label);
            const bool fused = at.run_attention(used ? &quant : nullptr);
            after();
            if (!fused) return 1;
            fused_producers_ += used;
            return 1 + used;
        };
        // l2 norms of q and k (in place) right before a serial delta rule that reads them
        if (fuse_l2_ && i + 2 < n && op.kind == PendingOp::Norm && pending_[i + 1].kind == PendingOp::Norm &&
            pending_[i + 2].kind == PendingOp::Gdr) {
            const cuda::DeltaArgs& g = pending_[i + 2].gdr;
            // the norm is in place over exactly the rows the delta rule reads (all tokens)
            auto covers = [&](const cuda::NormJob& nj, const float* p, int64_t ph, int64_t pt) {
                const cuda::Rows &x = nj.x, &y = nj.y;
                return nj.op == cuda::NormOp::L2 && x.data == p && y.data == p && x.n == g.dk && x.n1 == g.Hk &&
                       y.n1 == x.n1 && y.n2 == x.n2 && x.s1 == ph && y.s1 == ph &&
                       (x.n2 == 1 || (x.s2 == pt && y.s2 == pt));
            };
            const cuda::NormJob& a = pending_[i].norm;
            const cuda::NormJob& b = pending_[i + 1].norm;
            if (covers(a, g.q, g.q_h, g.q_t) && covers(b, g.k, g.k_h, g.k_t) && a.eps == b.eps && a.x.n2 == b.x.n2) {
                const PendingOp& go = pending_[i + 2];
                cuda::DeltaArgs fused = go.gdr;
                fused.l2_qk = true;
                fused.l2_eps = a.eps;
                if (gdr_norm_at(i + 2, fused)) {
                    run_gdr_norm(i + 2, fused, "fused: " + op.label + " + " + pending_[i + 1].label + " + " + go.label);
                    fused_producers_ += 2;
                    i += 5;
                    continue;
                }
                if (prof) before("fused: " + op.label + " + " + pending_[i + 1].label + " + " + go.label);
                cuda::gated_delta_rule(fused, go.gdr_seg, go.gdr_n_seg, go.gdr_max_len, stream_);
                after();
                fused_producers_ += 2;
                i += 3;
                continue;
            }
        }
        if (fuse_ffn_ && op.kind == PendingOp::Norm && i + 7 < n && try_ffn(i)) {
            if (prof) {
                std::string label = "fused FFN:";
                for (size_t k = i; k < i + 8; ++k) label += (k > i ? " + " : " ") + pending_[k].label;
                before(label);
            }
            cuda::ffn_decode(ffn_job_, stream_);
            after();
            fused_producers_ += 7;
            i += 8;
            continue;
        }
        if (fuse_norm_ && (op.kind == PendingOp::Norm || op.kind == PendingOp::Gate)) {
            auto is = [&](size_t k, PendingOp::Kind kind) { return k < n && pending_[k].kind == kind; };
            // producer k into the quantization k + 1
            auto quant_at = [&](size_t k) {
                if (!is(k + 1, PendingOp::Quantize)) return false;
                const PendingOp& a = pending_[k];
                const cuda::ActDest& q = pending_[k + 1].dest;
                if (a.kind == PendingOp::Norm) return cuda::norm_quantize_fits(a.norm, q);
                return a.kind == PendingOp::Gate && cuda::gate_quantize_fits(a.a, a.b, a.y, q);
            };
            auto pair_at = [&](size_t k) {
                return is(k, PendingOp::Norm) && is(k + 1, PendingOp::Norm) &&
                       cuda::norm_pair_fits(pending_[k].norm, pending_[k + 1].norm);
            };
            // norm pair k, k + 1 and the rope of each (q and k heads)
            auto pair_rope_at = [&](size_t k) {
                return pair_at(k) && is(k + 2, PendingOp::Rope) && is(k + 3, PendingOp::Rope) &&
                       cuda::norm_rope_fits(pending_[k].norm, &pending_[k + 1].norm, pending_[k + 2].rope,
                                            &pending_[k + 3].rope);
            };
            auto one_rope_at = [&](size_t k) {
                return is(k, PendingOp::Norm) && is(k + 1, PendingOp::Rope) &&
                       cuda::norm_rope_fits(pending_[k].norm, nullptr, pending_[k + 1].rope, nullptr);
            };
            // ... and the cache store of the attention right after them
            auto store_at = [&](size_t k) {
                return fuse_kv_store_ && is(k + 4, PendingOp::Attention) &&
                       cuda::norm_rope_store_fits(pending_[k].norm, pending_[k + 1].norm, pending_[k + 2].rope,
                                                  pending_[k + 3].rope, pending_[k + 4].kv_store);
            };
            size_t used = 0;
            if (pair_rope_at(i) && store_at(i)) {
                const PendingOp& at = pending_[i + 4];
                if (prof) {
                    std::string label = "fused:";
                    for (size_t k = i; k < i + 4; ++k) label += " " + pending_[k].label + " +";
                    before(label + " kv_store");
                }
                cuda::norm_rope(op.norm, &pending_[i + 1].norm, pending_[i + 2].rope, &pending_[i + 3].rope, stream_,
                                &at.kv_store);
                after();
                fused_producers_ += 2;
                i += 4 + run_attention_at(i + 4, at.label + " (stored)");
                continue;
            }
            if (pair_rope_at(i)) used = 4;
            else if (quant_at(i) || one_rope_at(i)) used = 2;
            // a plain pair, unless its second norm has a better partner after it
            else if (pair_at(i) && !quant_at(i + 1) && !pair_rope_at(i + 1) && !one_rope_at(i + 1)) used = 2;
            if (used) {
                if (prof) {
                    std::string label = "fused:";
                    for (size_t k = i; k < i + used; ++k) label += (k > i ? " + " : " ") + pending_[k].label;
                    before(label);
                }
                const PendingOp& nx = pending_[i + 1];
                if (used == 4) cuda::norm_rope(op.norm, &nx.norm, pending_[i + 2].rope, &pending_[i + 3].rope, stream_);
                else if (nx.kind == PendingOp::Rope) cuda::norm_rope(op.norm, nullptr, nx.rope, nullptr, stream_);
                else if (nx.kind == PendingOp::Norm) cuda::norm_pair(op.norm, nx.norm, stream_);
                else if (op.kind == PendingOp::Norm) cuda::norm_quantize(op.norm, nx.dest, stream_);
                else cuda::gate_quantize(op.gate, op.a, op.b, op.y, nx.dest, stream_);
                after();
                ++fused_producers_;
                i += used;
                continue;
            }
        }
        if (op.kind == PendingOp::Attention && fuse_attn_quant_) {
            const cuda::KvStoreJob& st = op.kv_store;
            if (prof) before("kv_store");
            cuda::kv_store(st.k, st.v, st.kv, st.pos, st.slot, op.kv_T, stream_);
            after();
            i += run_attention_at(i, op.label);
            continue;
        }
        if (op.kind != PendingOp::Matvec || !fuse_) {
            before(op.label);
            op.run();
            after();
            ++i;
            continue;
        }
        cuda::MatvecJob jobs[cuda::kMaxMatvecJobs];
        int nj = 0;
        size_t j = i;
        while (j < n && nj < cuda::kMaxMatvecJobs && pending_[j].kind == PendingOp::Matvec &&
               pending_[j].act.qs == op.act.qs && pending_[j].T == op.T)
            jobs[nj++] = pending_[j++].mv;
        bool residual = false;
        if (j < n && pending_[j].kind == PendingOp::Add) {
            const PendingOp& ad = pending_[j];
            cuda::MatvecJob& last = jobs[nj - 1];
            const int64_t N = last.w.N, T = op.T;
            auto plain = [&](const cuda::Rows& r, bool check_stride, int64_t ld) {
                return r.n == N && r.n1 == T && r.n2 == 1 && (T == 1 || !check_stride || r.s1 == ld);
            };
            bool a_is_output = false;
            for (int k = 0; k < nj; ++k) a_is_output |= ad.a.data == jobs[k].y;
            if (ad.b.data == last.y && plain(ad.b, true, last.ldy) && plain(ad.a, false, 0) &&
                plain(ad.y, false, 0) && !a_is_output) {
                last.res = ad.a.data;
                last.ld_res = ad.a.s1;
                last.res_out = ad.y.data;
                last.ld_res_out = ad.y.s1;
                residual = true;
                ++j;
            }
        }
        // a one-token conv of one of the outputs, in the products' epilogue
        std::string conv_label;
        if (fuse_conv_ && !residual && j < n && pending_[j].kind == PendingOp::Conv &&
            cuda::conv_after_fits(jobs, nj, op.T)) {
            for (int k = 0; k < nj; ++k)
                if (jobs[k].y == pending_[j].conv_x && jobs[k].w.N == pending_[j].conv_C) {
                    jobs[k].conv = pending_[j].conv;
                    conv_label = " + " + pending_[j].label;
                    ++j;
                    ++fused_producers_;
                    break;
                }
        }
        if (prof) {
            std::string label = nj > 1 || residual || !conv_label.empty() ? "fused:" : "";
            for (size_t k = i; k < i + size_t(nj); ++k) label += (k > i ? " + " : " ") + pending_[k].label;
            if (residual) label += " + add";
            label += conv_label;
            before(label);
        }
        if (nj == 1 && !residual && conv_label.empty()) op.run();
        else cuda::matmul_vec_multi(jobs, nj, op.act, op.T, stream_);
        after();
        i = j;
    }
    if (prof) {
        release();
        QINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (size_t k = 0; k < labels.size(); ++k) {
            float ms = 0;
            QINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, profile_events_[2 * k], profile_events_[2 * k + 1]));
            ProfileStat& st = profile_stats_[labels[k]];
            st.calls++;
            st.ms += ms;
        }
    }
}

uint32_t CudaBackend::last_op_code() const {
    uint32_t code = 0;
    if (sig_.size() >= last_sig_at_ + sizeof(code)) std::memcpy(&code, sig_.data() + last_sig_at_, sizeof(code));
    return code;
}

std::string CudaBackend::profile_label() const {
    const uint32_t code = last_op_code();
    if (const char* name = op_name(code)) return name;
    return strfmt("op %u", code);
}

void CudaBackend::print_profile() const {
    if (profile_stats_.empty()) return;
    std::vector<std::pair<std::string, ProfileStat>> rows(profile_stats_.begin(), profile_stats_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::fprintf(stderr, "%s profile (GPU time per op, eager, kernels back to back): %.2f ms in all\n", name_.c_str(),
                 total);
    std::fprintf(stderr, "%10s %6s %8s %10s  %s\n", "ms", "%", "calls", "us/call", "op");
    for (const auto& [label, st] : rows)
        std::fprintf(stderr, "%10.3f %6.2f %8llu %10.2f  %s\n", st.ms, 100.0 * st.ms / total,
                     (unsigned long long)st.calls, 1000.0 * st.ms / double(st.calls), label.c_str());
}

void CudaBackend::flush() {
    if (pending_.empty()) return;
    print_load_stats_once();
    // The queue's signature decides: replay, record, or run as it is.
    uint64_t h = 1469598103934665603ull;
    for (uint8_t c : sig_) h = (h ^ c) * 1099511628211ull;
    auto it = auto_graphs_.find(h);
    GraphRec* rec = it != auto_graphs_.end() && it->second.sig == sig_ ? &it->second : nullptr;
    struct Clear {
        CudaBackend* b;
        ~Clear() {
            b->pending_.clear();
            b->payloads_.clear();
            b->sig_.clear();
            for (ActCache& c : b->act_cache_) c.valid = false;
        }
    } clear{this};
    if (rec && rec->exec) {
        QINFER_CUDA_CHECK(cudaEventSynchronize(rec->done));  // the last replay no longer reads the payloads
        for (size_t i = 0; i < payloads_.size(); ++i)
            std::memcpy(rec->pinned[i], payloads_[i].data.data(), payloads_[i].data.size());
        QINFER_CUDA_CHECK(cudaGraphLaunch(rec->exec, stream_));
        QINFER_CUDA_CHECK(cudaEventRecord(rec->done, stream_));
        ++rec->hits;
        ++graph_launches_;
        return;
    }
    size_t recorded = 0;
    for (const auto& kv : auto_graphs_) recorded += kv.second.exec != nullptr;
    const bool record = !profile_ && rec && rec->seen >= 1 && recorded < 64 && pending_.size() >= 4;
    if (!record) {
        run_pending(nullptr);
        ++eager_flushes_;
        if (rec) {
            ++rec->seen;
        } else if (it == auto_graphs_.end()) {
            if (auto_graphs_.size() > 256) {  // many one-off shapes (prefill): forget the unrecorded ones
                for (auto g = auto_graphs_.begin(); g != auto_graphs_.end();)
                    g = g->second.exec ? std::next(g) : auto_graphs_.erase(g);
            }
            GraphRec& r = auto_graphs_[h];
            r.sig = sig_;
            r.seen = 1;
        }
        return;
    }
    // Record: payloads move to pinned buffers the graph's copy nodes read.
    for (const Payload& p : payloads_) {
        void* pin = nullptr;
        QINFER_CUDA_CHECK(cudaMallocHost(&pin, std::max<size_t>(p.data.size(), 1)));
        std::memcpy(pin, p.data.data(), p.data.size());
        rec->pinned.push_back(pin);
    }
    QINFER_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    cudaGraph_t g = nullptr;
    try {
        run_pending(&rec->pinned);
    } catch (...) {
        capturing_ = false;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        destroy_graph(*rec);
        auto_graphs_.erase(h);
        throw;
    }
    capturing_ = false;
    QINFER_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    const cudaError_t e = cudaGraphInstantiate(&rec->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) cuda::throw_cuda(e, "cudaGraphInstantiate", __FILE__, __LINE__);
    QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&rec->done, cudaEventDisableTiming));
    QINFER_CUDA_CHECK(cudaGraphLaunch(rec->exec, stream_));
    QINFER_CUDA_CHECK(cudaEventRecord(rec->done, stream_));
    ++graph_launches_;
}

// Explicit step graphs: ops between begin_graph and end_graph are recorded once
// per key and replayed without the caller issuing them again.
bool CudaBackend::begin_graph(uint64_t key, bool record) {
    if (!graphs_enabled_) return true;
    if (in_keyed_) fail("CUDA: begin_graph inside a recorded step");
    flush();
    print_load_stats_once();
    in_keyed_ = true;
    keyed_key_ = key;
    keyed_eager_ = !record;
    if (keyed_eager_) {
        keyed_replay_ = false;
        return true;
    }
    if (keyed_graphs_.size() > 256) {  // many one-off shapes (prompts): forget the unrecorded ones
        for (auto g = keyed_graphs_.begin(); g != keyed_graphs_.end();)
            g = g->second.exec ? std::next(g) : keyed_graphs_.erase(g);
    }
    auto it = keyed_graphs_.find(key);
    keyed_replay_ = !profile_ && it != keyed_graphs_.end() && it->second.exec;
    return !keyed_replay_;
}

void CudaBackend::end_graph() {
    if (!graphs_enabled_) return;
    if (!in_keyed_) fail("CUDA: end_graph without begin_graph");
    in_keyed_ = false;
    GraphRec& rec = keyed_graphs_[keyed_key_];
    struct Clear {
        CudaBackend* b;
        ~Clear() {
            b->pending_.clear();
            b->payloads_.clear();
            b->sig_.clear();
            for (ActCache& c : b->act_cache_) c.valid = false;
        }
    } clear{this};
    if (keyed_eager_) {
        run_pending(nullptr);
        ++eager_flushes_;
        return;
    }
    if (keyed_replay_) {
        QINFER_CUDA_CHECK(cudaGraphLaunch(rec.exec, stream_));
        ++graph_launches_;
        return;
    }
    size_t recorded = 0;
    for (const auto& kv : keyed_graphs_) recorded += kv.second.exec != nullptr;
    if (rec.seen == 0 || recorded >= 64 || profile_) {  // first sighting sizes the scratch buffers
        ++rec.seen;
        print_load_stats_once();
        run_pending(nullptr);
        ++eager_flushes_;
        return;
    }
    QINFER_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    cudaGraph_t g = nullptr;
    try {
        run_pending(nullptr);
    } catch (...) {
        capturing_ = false;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        throw;
    }
    capturing_ = false;
    QINFER_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    const cudaError_t e = cudaGraphInstantiate(&rec.exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) cuda::throw_cuda(e, "cudaGraphInstantiate", __FILE__, __LINE__);
    QINFER_CUDA_CHECK(cudaGraphLaunch(rec.exec, stream_));
    ++graph_launches_;
}

void CudaBackend::abort_graph() {
    if (!in_keyed_) return;
    in_keyed_ = false;
    pending_.clear();
    payloads_.clear();
    sig_.clear();
    for (ActCache& c : act_cache_) c.valid = false;
}

}  // namespace qinfer
