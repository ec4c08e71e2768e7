#include "runtime/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/error.h"

namespace qinfer {

void set_contiguous_strides(Tensor& t) {
    const TypeTraits& tt = traits(t.type);
    t.nb[0] = tt.type_size;
    t.nb[1] = size_t(t.ne[0] / tt.block_size) * tt.type_size;
    t.nb[2] = t.nb[1] * size_t(t.ne[1]);
    t.nb[3] = t.nb[2] * size_t(t.ne[2]);
}

Tensor tensor_desc(GgmlType type, const int64_t ne[4], Backend* backend, const char* name) {
    Tensor t;
    t.type = type;
    for (int i = 0; i < 4; ++i) t.ne[i] = ne[i];
    set_contiguous_strides(t);
    t.backend = backend;
    t.name = name;
    return t;
}

bool Tensor::is_contiguous() const {
    Tensor c = *this;
    set_contiguous_strides(c);
    for (int i = 1; i < 4; ++i)
        if (ne[i] > 1 && nb[i] != c.nb[i]) return false;
    return true;
}

size_t Tensor::nbytes() const {
    const TypeTraits& tt = traits(type);
    size_t n = size_t(ne[0] / tt.block_size) * tt.type_size;
    for (int i = 1; i < 4; ++i) n += size_t(ne[i] - 1) * nb[i];
    return n;
}

Tensor view(const Tensor& t, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset) {
    Tensor v = t;
    int i = 0;
    for (int64_t n : ne) v.ne[i++] = n;
    for (; i < 4; ++i) v.ne[i] = 1;
    set_contiguous_strides(v);
    i = 1;
    for (size_t s : nb) v.nb[i++] = s;  // nb lists strides of dims 1.. (dim 0 is the element size)
    v.data = static_cast<uint8_t*>(t.data) + offset;
    return v;
}

Tensor first_rows(const Tensor& t, int64_t n) {
    Tensor v = t;
    if (n > t.ne[1] || t.ne[2] != 1 || t.ne[3] != 1)
        fail(strfmt("tensor '%s' %s: cannot take %lld rows", t.name, shape_str(t).c_str(), (long long)n));
    v.ne[1] = n;
    return v;
}

Tensor reshape(const Tensor& t, std::initializer_list<int64_t> ne) {
    Tensor v = t;
    int i = 0;
    int64_t n = 1;
    for (int64_t x : ne) {
        v.ne[i++] = x;
        n *= x;
    }
    for (; i < 4; ++i) v.ne[i] = 1;
    if (n != t.n_elements() || !t.is_contiguous())
        fail(strfmt("tensor '%s': cannot reshape %s", t.name, shape_str(t).c_str()));
    set_contiguous_strides(v);
    return v;
}

std::string shape_str(const Tensor& t) {
    int n = 4;
    while (n > 1 && t.ne[n - 1] == 1) --n;
    std::string s = "{";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
    return s + "}";
}

size_t Backend::weight_bytes(GgmlType type, const int64_t ne[4]) const {
    Tensor t;
    t.type = type;
    for (int i = 0; i < 4; ++i) t.ne[i] = ne[i];
    set_contiguous_strides(t);
    return t.nbytes();
}

// Host-memory backends: the blocks are copied as they are.
Tensor Backend::stream_weight(const Tensor& arena, size_t offset, GgmlType type, const int64_t ne[4],
                              const void* src, const char* name) {
    const size_t bytes = weight_bytes(type, ne);
    if (!host_memory()) fail(strfmt("%s: stream_weight is not implemented", this->name().c_str()));
    if (arena.backend != this || offset % 256 != 0 || offset + bytes > arena.nbytes())
        fail(strfmt("stream_weight '%s': %zu bytes at offset %zu do not fit arena '%s' (%zu bytes)", name, bytes,
                    offset, arena.name, arena.nbytes()));
    Tensor t = tensor_desc(type, ne, this, name);
    t.data = static_cast<uint8_t*>(arena.data) + offset;
    write(arena, src, bytes, offset);  // ordered after the ops already issued
    return t;
}

void copy_between(const Tensor& src, const Tensor& dst) {
    size_t bytes = src.nbytes();
    if (!src.is_contiguous() || !dst.is_contiguous() || dst.nbytes() != bytes || src.type != dst.type)
        fail(strfmt("copy %s -> %s: shapes differ or not contiguous", src.name, dst.name));
    if (src.backend == dst.backend) {
        src.backend->copy(src, dst);
    } else if (src.backend->host_memory()) {
        src.backend->synchronize();  // src.data is read directly: finish src's pending ops first
        dst.backend->write(dst, src.data, bytes);
        dst.backend->synchronize();  // src may be overwritten by the next host-side op
    } else if (dst.backend->host_memory()) {
        src.backend->read(src, dst.data, bytes);
    } else {
        std::vector<uint8_t> staging(bytes);
        src.backend->read(src, staging.data(), bytes);
        dst.backend->write(dst, staging.data(), bytes);
        dst.backend->synchronize();
    }
}

}  // namespace qinfer

namespace qinfer {

uint64_t Backend::read_async(const Tensor& src, size_t bytes, size_t offset) {
    std::vector<uint8_t> copy(bytes);
    read(src, copy.data(), bytes, offset);
    const uint64_t ticket = next_ticket_++;
    early_reads_.emplace(ticket, std::move(copy));
    return ticket;
}

void Backend::finish_read(uint64_t ticket, void* dst) {
    const auto it = early_reads_.find(ticket);
    if (it == early_reads_.end()) fail(strfmt("%s: no read with ticket %llu", name().c_str(), (unsigned long long)ticket));
    if (!it->second.empty()) std::memcpy(dst, it->second.data(), it->second.size());
    early_reads_.erase(it);
}

void Backend::argmax(const Tensor& logits, const Tensor& ids) {
    const int64_t V = logits.ne[0], T = logits.ne[1];
    if (ids.type != GgmlType::I32 || ids.ne[0] < T || logits.type != GgmlType::F32)
        fail(strfmt("argmax: logits %s / ids %s do not fit", shape_str(logits).c_str(), shape_str(ids).c_str()));
    std::vector<float> row(static_cast<size_t>(V));
    std::vector<int32_t> out(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
        read(logits, row.data(), size_t(V) * 4, size_t(t) * logits.nb[1]);
        int64_t best = 0;
        for (int64_t i = 1; i < V; ++i)
            if (row[size_t(i)] > row[size_t(best)]) best = i;
        out[size_t(t)] = int32_t(best);
    }
    write(ids, out.data(), size_t(T) * 4);
    synchronize();
}

void top_k_slice(const float* row, int64_t begin, int64_t end, int64_t k, std::vector<uint64_t>& best) {
    // A min-heap of the best k so far. Most elements fail a plain float compare
    // with the heap's worst: below it (or NaN) they cannot enter; equal ones go
    // on to the full order (the index decides, and -0 meets +0 there).
    const size_t base = best.size();
    auto heap = [&] { return best.begin() + std::ptrdiff_t(base); };
    int64_t i = begin;
    for (; i < end && int64_t(best.size() - base) < k; ++i) {
        best.push_back(top_k_order(row[i], i));
        std::push_heap(heap(), best.end(), std::greater<uint64_t>());
    }
    if (i >= end) return;
    auto floor_of = [&] {
        const float w = row[top_k_index(best[base])];
        return std::isnan(w) ? -INFINITY : w;  // a NaN worst: anything but NaN may enter
    };
    float floor = floor_of();
    for (; i < end; ++i) {
        if (!(row[i] >= floor)) continue;
        const uint64_t o = top_k_order(row[i], i);
        if (o <= best[base]) continue;
        std::pop_heap(heap(), best.end(), std::greater<uint64_t>());
        best.back() = o;
        std::push_heap(heap(), best.end(), std::greater<uint64_t>());
        floor = floor_of();
    }
}

void check_top_k_shapes(const Tensor& logits, const Tensor& values, const Tensor& ids) {
    const int64_t V = logits.ne[0], T = logits.ne[1], k = values.ne[0];
    if (logits.type != GgmlType::F32 || values.type != GgmlType::F32 || ids.type != GgmlType::I32 || k < 1 ||
        k > V || ids.ne[0] != k || values.ne[1] < T || ids.ne[1] < T || values.nb[1] != size_t(k) * 4 ||
        ids.nb[1] != size_t(k) * 4)
        fail(strfmt("top_k: logits %s / values %s / ids %s do not fit", shape_str(logits).c_str(),
                    shape_str(values).c_str(), shape_str(ids).c_str()));
}

void Backend::top_k(const Tensor& logits, const Tensor& values, const Tensor& ids) {
    check_top_k_shapes(logits, values, ids);
    const int64_t V = logits.ne[0], T = logits.ne[1], k = values.ne[0];
    std::vector<float> row(static_cast<size_t>(V));
    std::vector<uint64_t> best;
    std::vector<float> vals(static_cast<size_t>(k * T));
    std::vector<int32_t> out(static_cast<size_t>(k * T));
    for (int64_t t = 0; t < T; ++t) {
        read(logits, row.data(), size_t(V) * 4, size_t(t) * logits.nb[1]);
        best.clear();
        top_k_slice(row.data(), 0, V, k, best);
        std::sort(best.begin(), best.end(), std::greater<uint64_t>());
        for (int64_t j = 0; j < k; ++j) {
            const int64_t i = top_k_index(best[size_t(j)]);
            vals[size_t(t * k + j)] = row[size_t(i)];
            out[size_t(t * k + j)] = int32_t(i);
        }
    }
    write(values, vals.data(), vals.size() * 4);
    write(ids, out.data(), out.size() * 4);
    synchronize();
}

#ifndef QINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, uint64_t) {
    fail("this build has no CUDA backend (configure with -DQINFER_CUDA=ON)");
}
int cuda_device_count() { return 0; }
bool cuda_memory_info(int, uint64_t*, uint64_t*) { return false; }
#endif

}  // namespace qinfer
