#include "plan/model_desc.h"

#include "common/error.h"
#include "gguf/gguf.h"

namespace qinfer {

const TensorEntry* ModelDesc::find(std::string_view tensor_name) const {
    for (const TensorEntry& t : tensors)
        if (t.name == tensor_name) return &t;
    return nullptr;
}

uint64_t ModelDesc::total_bytes() const {
    uint64_t n = 0;
    for (const TensorEntry& t : tensors) n += t.nbytes;
    return n;
}

ModelDesc describe_model(const gguf::File& f, const HParams& hp) {
    ModelDesc d;
    d.name = f.path();
    d.hp = hp;
    d.tensors.reserve(f.tensors().size());
    for (const gguf::TensorInfo& ti : f.tensors()) {
        TensorEntry e;
        e.name = ti.name;
        e.type = ti.type;
        for (int i = 0; i < 4; ++i) e.ne[i] = ti.ne[i];
        e.nbytes = ti.nbytes;
        d.tensors.push_back(std::move(e));
    }
    return d;
}

uint64_t tensor_nbytes(GgmlType type, const int64_t ne[4]) {
    const TypeTraits& tt = traits(type);
    if (ne[0] % int64_t(tt.block_size) != 0)
        fail(strfmt("plan: a row of %lld elements is not a whole number of %s blocks (%u)", (long long)ne[0],
                    tt.name, tt.block_size));
    uint64_t rows = uint64_t(ne[1]) * uint64_t(ne[2]) * uint64_t(ne[3]);
    return uint64_t(ne[0]) / tt.block_size * tt.type_size * rows;
}

int64_t tensor_layer(std::string_view name) {
    if (name.substr(0, 4) != "blk.") return -1;
    int64_t n = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
        n = n * 10 + (name[i] - '0');
        if (n > (int64_t(1) << 31)) return -1;
    }
    if (i == 4 || i >= name.size() || name[i] != '.') return -1;
    return n;
}

}  // namespace qinfer
