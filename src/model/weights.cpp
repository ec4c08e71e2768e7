#include "model/weights.h"

#include <cstdlib>

#include "common/error.h"
#include "gguf/gguf.h"

namespace qinfer {

namespace {
std::string shape_of(const int64_t* ne, int n) {
    std::string s = "{";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "}";
}
}  // namespace

bool WeightBinder::has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

const gguf::TensorInfo& WeightBinder::find(const std::string& name) const {
    const gguf::TensorInfo* ti = f_.find_tensor(name);
    if (!ti) fail(strfmt("model: %s: required tensor '%s' is missing", f_.path().c_str(), name.c_str()));
    return *ti;
}

void WeightBinder::check_shape(const gguf::TensorInfo& ti, std::initializer_list<int64_t> ne) const {
    int n = int(ne.size());
    bool ok = true;
    int i = 0;
    for (int64_t x : ne) ok = ok && ti.ne[i++] == x;
    for (; i < 4; ++i) ok = ok && ti.ne[i] == 1;
    if (!ok) {
        int have = int(ti.n_dims) > n ? int(ti.n_dims) : n;
        fail(strfmt("model: %s: tensor '%s' has shape %s, expected %s", f_.path().c_str(), ti.name.c_str(),
                    shape_of(ti.ne, have).c_str(), shape_of(ne.begin(), n).c_str()));
    }
}

Tensor WeightBinder::upload(const gguf::TensorInfo& ti) {
    if (!be_) fail("model: internal: no backend selected for weights");
    bound_.insert(ti.name);
    return be_->upload_weight(ti);
}

Tensor WeightBinder::matrix(const std::string& name, int64_t n_in, int64_t n_out) {
    const gguf::TensorInfo& ti = find(name);
    check_shape(ti, {n_in, n_out});
    const TypeTraits& tt = traits(ti.type);
    if (!tt.supported || ti.type == GgmlType::Q8_K || ti.type == GgmlType::I8 || ti.type == GgmlType::I16 ||
        ti.type == GgmlType::I32 || ti.type == GgmlType::I64 || ti.type == GgmlType::F64)
        fail(strfmt("model: %s: tensor '%s' has type %s, which cannot be used as a weight matrix", f_.path().c_str(),
                    name.c_str(), tt.name));
    if (n_in % tt.block_size != 0)
        fail(strfmt("model: %s: tensor '%s': row length %lld is not a multiple of the %s block size %u",
                    f_.path().c_str(), name.c_str(), (long long)n_in, tt.name, tt.block_size));
    return upload(ti);
}

Tensor WeightBinder::f32(const std::string& name, std::initializer_list<int64_t> ne) {
    const gguf::TensorInfo& ti = find(name);
    check_shape(ti, ne);
    if (ti.type != GgmlType::F32)
        fail(strfmt("model: %s: tensor '%s' has type %s, expected F32", f_.path().c_str(), name.c_str(),
                    type_name(ti.type)));
    return upload(ti);
}

Tensor WeightBinder::optional_f32(const std::string& name, std::initializer_list<int64_t> ne) {
    return has(name) ? f32(name, ne) : Tensor{};
}

Tensor WeightBinder::optional_matrix(const std::string& name, int64_t n_in, int64_t n_out) {
    return has(name) ? matrix(name, n_in, n_out) : Tensor{};
}

std::vector<std::string> WeightBinder::unused(int64_t n_layer) const {
    std::vector<std::string> out;
    for (const gguf::TensorInfo& ti : f_.tensors()) {
        if (bound_.count(ti.name)) continue;
        if (ti.name.rfind("blk.", 0) == 0 && std::atoll(ti.name.c_str() + 4) >= n_layer) continue;  // MTP layers
        out.push_back(ti.name);
    }
    return out;
}

}  // namespace qinfer
