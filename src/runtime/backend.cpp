#include "runtime/backend.h"

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

#ifndef QINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, uint64_t) {
    fail("this build has no CUDA backend (configure with -DQINFER_CUDA=ON)");
}
int cuda_device_count() { return 0; }
bool cuda_memory_info(int, uint64_t*, uint64_t*) { return false; }
#endif

}  // namespace qinfer
