// Weights streamed into arenas (prompt offload) on the CUDA backend: for
// every weight type the GPU kernels take, a product with the streamed weight
// equals, bit for bit, the product with the same blocks uploaded at load —
// through the pinned-range path (DMA from the mapped pages, repack kernel on
// the GPU) and through the staging ring — with two arenas used in turn as
// prompt offload does: the next weight is copied while the previous product
// is still queued, and an arena is refilled only after the product that read
// it was read back. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"

namespace qinfer {
namespace {

using test::randn;

// Page-aligned host memory that owns every page it touches, as a file mapping
// does: pinning works on whole pages (read-only), so a buffer that ended inside
// a page would pin the start of whatever the heap put after it, and a copy back
// into that memory fails (cudaErrorInvalidValue), depending on the heap's layout.
struct PageBuffer {
    explicit PageBuffer(size_t n) : storage((n + 4095) / 4096 * 4096 + 4096, 0) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(storage.data());
        p = storage.data() + ((4096 - a % 4096) % 4096);
    }
    std::vector<uint8_t> storage;
    uint8_t* p = nullptr;
};

TEST(CudaStream, StreamedWeightsEqualUploaded) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16,  GgmlType::F32};
    const int64_t K = 512, N = 300, T = 40;
    for (bool pin : {true, false}) {
        std::unique_ptr<Backend> be = make_cuda_backend(0);
        // One "file" holding every type's blocks back to back.
        std::vector<size_t> off;
        size_t total = 0;
        for (GgmlType t : types) {
            off.push_back(total);
            total += (size_t(K) / size_t(traits(t).block_size) * traits(t).type_size * size_t(N) + 255) / 256 * 256;
        }
        PageBuffer file(total);
        for (size_t i = 0; i < std::size(types); ++i) {
            const std::vector<float> w = randn(size_t(K * N), uint32_t(10 + i));
            const size_t row = size_t(K) / size_t(traits(types[i]).block_size) * traits(types[i]).type_size;
            for (int64_t r = 0; r < N; ++r)
                quantize_row(types[i], w.data() + r * K, file.p + off[i] + size_t(r) * row, K);
        }
        if (pin) {
            EXPECT_TRUE(be->pin_streamed_range(file.p, total)) << "cudaHostRegister of a page-aligned buffer";
        }

        const int64_t ne[4] = {K, N, 1, 1};
        size_t arena_bytes = 0;
        for (GgmlType t : types) arena_bytes = std::max(arena_bytes, be->weight_bytes(t, ne));
        Tensor arenas[2] = {be->alloc(GgmlType::I8, {int64_t(arena_bytes)}, "arena0"),
                            be->alloc(GgmlType::I8, {int64_t(arena_bytes)}, "arena1")};
        Tensor x = be->alloc(GgmlType::F32, {K, T}, "x");
        const std::vector<float> xv = randn(size_t(K * T), 7);
        be->write(x, xv.data(), xv.size() * 4);
        std::vector<Tensor> y_stream, y_upload;
        std::vector<std::vector<float>> got(std::size(types));
        for (size_t i = 0; i < std::size(types); ++i) {
            const void* src = file.p + off[i];
            const Tensor ws = be->stream_weight(arenas[i % 2], 0, types[i], ne, src, "streamed");
            y_stream.push_back(be->alloc(GgmlType::F32, {N, T}, "ys"));
            be->matmul(ws, x, y_stream.back(), nullptr);  // queued while the next weight is copied
            if (i > 0) {  // the previous arena's product, read back before that arena is refilled
                got[i - 1].resize(size_t(N * T));
                be->read(y_stream[i - 1], got[i - 1].data(), got[i - 1].size() * 4);
            }
            gguf::TensorInfo ti;
            ti.name = "uploaded";
            ti.type = types[i];
            ti.n_dims = 2;
            ti.ne[0] = K;
            ti.ne[1] = N;
            ti.data = static_cast<const uint8_t*>(src);
            ti.nbytes = size_t(K) / size_t(traits(types[i]).block_size) * traits(types[i]).type_size * size_t(N);
            const Tensor wu = be->upload_weight(ti);
            y_upload.push_back(be->alloc(GgmlType::F32, {N, T}, "yu"));
            be->matmul(wu, x, y_upload.back(), nullptr);
        }
        for (size_t i = 0; i < std::size(types); ++i) {
            std::vector<float> a(size_t(N * T)), b(size_t(N * T));
            if (got[i].empty()) be->read(y_stream[i], a.data(), a.size() * 4);
            else a = got[i];
            be->read(y_upload[i], b.data(), b.size() * 4);
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
                << type_name(types[i]) << (pin ? " pinned" : " staged") << ": first " << a[0] << " vs " << b[0];
        }
        be.reset();  // unregisters the range before the buffer goes
    }
}

}  // namespace
}  // namespace qinfer
