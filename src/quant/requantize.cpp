#include "quant/requantize.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

#include "common/error.h"
#include "common/thread_pool.h"
#include "gguf/writer.h"
#include "quant/quant.h"

namespace qinfer {

namespace {

// Layer number of "blk.N.*", -1 for everything else (as sscanf("blk.%d.") would).
int layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    size_t i = 4;
    int n = 0;
    bool digits = false;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 100000000) {
        n = n * 10 + (name[i++] - '0');
        digits = true;
    }
    return digits ? n : -1;
}

std::string shape_str(const gguf::TensorInfo& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
}

// Converts `rows` rows of `t` (starting at `row0`) to `to`, into dst.
void convert_rows(const gguf::TensorInfo& t, GgmlType to, int64_t row0, int64_t rows, uint8_t* dst,
                  ThreadPool& pool, std::vector<std::vector<float>>& scratch) {
    const int64_t ne0 = t.ne[0];
    const size_t in_rb = row_bytes(t.type, ne0), out_rb = row_bytes(to, ne0);
    const int64_t per_task = std::max<int64_t>(1, std::min<int64_t>(64, rows / (pool.size() * 4)));
    pool.parallel_for((rows + per_task - 1) / per_task, [&](int64_t task, int tid) {
        std::vector<float>& f = scratch[size_t(tid)];
        f.resize(size_t(ne0));
        const int64_t r1 = std::min(rows, (task + 1) * per_task);
        for (int64_t r = task * per_task; r < r1; ++r) {
            dequantize_row(t.type, t.data + size_t(row0 + r) * in_rb, f.data(), ne0);
            quantize_row(to, f.data(), dst + size_t(r) * out_rb, ne0);
        }
    });
}

}  // namespace

std::vector<const gguf::TensorInfo*> tensor_visit_order(const gguf::File& in) {
    std::vector<const gguf::TensorInfo*> v;
    for (const auto& t : in.tensors()) v.push_back(&t);
    std::stable_sort(v.begin(), v.end(), [](const gguf::TensorInfo* a, const gguf::TensorInfo* b) {
        const int la = layer_of(a->name), lb = layer_of(b->name);
        if (la != lb) return la < lb;
        return a->name < b->name;
    });
    return v;
}

RequantizeStats requantize_file(const gguf::File& in, const std::string& out_path, const RequantizeOptions& opt) {
    const auto t_start = std::chrono::steady_clock::now();
    if (!opt.choose_type) fail("quantize: no type policy given");
    RequantizeStats st;

    gguf::Writer w;
    w.copy_metadata(in, [](std::string_view key) { return key.rfind("split.", 0) != 0; });
    // llama-quantize re-adds these two at the end of the metadata.
    w.remove("general.quantization_version");
    w.set_u32("general.quantization_version", 2);
    w.remove("general.file_type");
    w.set_u32("general.file_type", opt.file_type);

    auto pool = std::make_shared<ThreadPool>(std::max(1, opt.n_threads));
    auto scratch = std::make_shared<std::vector<std::vector<float>>>(size_t(pool->size()));
    const auto order = tensor_visit_order(in);
    for (size_t idx = 0; idx < order.size(); ++idx) {
        const gguf::TensorInfo& t = *order[idx];
        const GgmlType to = opt.choose_type(t);
        if (!type_traits(uint32_t(to))) fail(strfmt("quantize: %s: invalid target type", t.name.c_str()));
        const uint32_t bs = traits(to).block_size;
        if (t.ne[0] % bs != 0)
            fail(strfmt("quantize: %s %s: row length %lld is not a multiple of the %s block size %u", t.name.c_str(),
                        shape_str(t).c_str(), (long long)t.ne[0], type_name(to), bs));
        const bool copy = to == t.type;
        if (!copy && !can_dequantize(t.type))
            fail(strfmt("quantize: %s: cannot read tensor type %s", t.name.c_str(), type_name(t.type)));
        if (!copy && !can_quantize(to))
            fail(strfmt("quantize: %s: cannot write tensor type %s", t.name.c_str(), type_name(to)));
        const int64_t rows = t.rows();
        const uint64_t out_bytes = uint64_t(row_bytes(to, t.ne[0])) * uint64_t(rows);
        st.n_tensors++;
        st.n_converted += copy ? 0 : 1;
        st.n_elements += uint64_t(t.n_elements());
        st.in_data_bytes += t.nbytes;
        st.out_data_bytes += out_bytes;
        if (opt.log)
            opt.log(strfmt("[%4zu/%4zu] %-36s %-18s %5s -> %-5s %9.2f MiB -> %8.2f MiB", idx + 1, order.size(),
                           t.name.c_str(), shape_str(t).c_str(), type_name(t.type), type_name(to),
                           double(t.nbytes) / (1 << 20), double(out_bytes) / (1 << 20)));
        const std::span<const int64_t> ne(t.ne, t.n_dims);
        if (copy) {
            w.add_tensor(t.name, to, ne, t.data);
            continue;
        }
        // Converted in batches of rows (<= 64 MiB of output) while the file is written.
        w.add_tensor(t.name, to, ne, [&t, to, rows, pool, scratch](const gguf::ByteSink& sink) {
            const size_t out_rb = row_bytes(to, t.ne[0]);
            const int64_t batch = std::max<int64_t>(1, int64_t((size_t(64) << 20) / out_rb));
            std::vector<uint8_t> buf(out_rb * size_t(std::min(batch, rows)));
            for (int64_t r0 = 0; r0 < rows; r0 += batch) {
                const int64_t n = std::min(batch, rows - r0);
                convert_rows(t, to, r0, n, buf.data(), *pool, *scratch);
                sink(buf.data(), out_rb * size_t(n));
            }
        });
    }
    w.write(out_path);
    st.out_file_bytes = w.file_size();
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return st;
}

}  // namespace qinfer
