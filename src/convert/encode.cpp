#include "convert/encode.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/thread_pool.h"
#include "quant/quant.h"

namespace qinfer::convert {

void encode_rows(GgmlType t, const float* src, int64_t ne0, int64_t n_rows, uint8_t* dst) {
    const size_t rb = row_bytes(t, ne0);
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, src, size_t(ne0 * n_rows) * 4); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < ne0 * n_rows; ++i) {
                uint16_t h = fp32_to_fp16(src[i]);
                std::memcpy(dst + 2 * i, &h, 2);
            }
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < ne0 * n_rows; ++i) {
                uint16_t h = fp32_to_bf16(src[i]);
                std::memcpy(dst + 2 * i, &h, 2);
            }
            return;
        default:
            if (ne0 % traits(t).block_size != 0)
                fail(strfmt("convert: row length %lld is not a multiple of %s's block size %u", (long long)ne0,
                            type_name(t), traits(t).block_size));
            for (int64_t r = 0; r < n_rows; ++r) quantize_row(t, src + r * ne0, dst + size_t(r) * rb, ne0);
    }
}

void stream_encoded_rows(const gguf::ByteSink& sink, GgmlType t, int64_t ne0, int64_t n_rows,
                         const EncodedRowProducer& produce, ThreadPool* pool) {
    const size_t rb = row_bytes(t, ne0);
    // Rows per task: ~256K elements keeps tasks coarse enough to amortise
    // scheduling and fine enough to balance; a batch is one task per thread x 4
    // so the write of one batch is short against its compute.
    const int64_t per_task = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(ne0, 1));
    const int n_threads = pool ? pool->size() : 1;
    const int64_t per_batch = per_task * n_threads * 4;
    std::vector<uint8_t> out(size_t(std::min(per_batch, n_rows)) * rb);
    for (int64_t b0 = 0; b0 < n_rows; b0 += per_batch) {
        const int64_t nb = std::min(per_batch, n_rows - b0);
        const int64_t n_tasks = (nb + per_task - 1) / per_task;
        // Workers must not throw; the first error is re-raised on this thread.
        std::exception_ptr err;
        std::mutex err_mu;
        auto task = [&](int64_t k, int) {
            try {
                const int64_t r0 = k * per_task, n = std::min(per_task, nb - r0);
                produce(b0 + r0, n, out.data() + size_t(r0) * rb);
            } catch (...) {
                std::lock_guard<std::mutex> lk(err_mu);
                if (!err) err = std::current_exception();
            }
        };
        if (pool && n_tasks > 1) pool->parallel_for(n_tasks, task);
        else
            for (int64_t k = 0; k < n_tasks; ++k) task(k, 0);
        if (err) std::rethrow_exception(err);
        sink(out.data(), size_t(nb) * rb);
    }
}

void stream_rows(const gguf::ByteSink& sink, GgmlType t, int64_t ne0, int64_t n_rows, const RowProducer& produce,
                 ThreadPool* pool) {
    stream_encoded_rows(
        sink, t, ne0, n_rows,
        [&](int64_t r0, int64_t n, uint8_t* dst) {
            // Per-call scratch: tasks run concurrently.
            std::vector<float> f32(size_t(n * ne0));
            produce(r0, n, f32.data());
            encode_rows(t, f32.data(), ne0, n, dst);
        },
        pool);
}

}  // namespace qinfer::convert
