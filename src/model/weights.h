// Tensor binding: looks GGUF tensors up by name, checks presence, exact shape
// and type class, and uploads them to the backend that will use them. A bad
// file fails here, at load, with the tensor named - never later inside a kernel.
#pragma once
#include <initializer_list>
#include <set>
#include <string>

#include "runtime/backend.h"

namespace qinfer {
namespace gguf { class File; }

class WeightBinder {
public:
    explicit WeightBinder(const gguf::File& f) : f_(f) {}

    // Backend that receives the tensors bound next.
    void set_backend(Backend* be) { be_ = be; }

    // A matrix {in, out} of any supported type, rows a whole number of blocks.
    Tensor matrix(const std::string& name, int64_t n_in, int64_t n_out);
    // An F32 tensor of exactly this shape (norm weights, biases, conv taps, ssm_a).
    Tensor f32(const std::string& name, std::initializer_list<int64_t> ne);
    // Same, but empty when the file does not have it.
    Tensor optional_f32(const std::string& name, std::initializer_list<int64_t> ne);
    Tensor optional_matrix(const std::string& name, int64_t n_in, int64_t n_out);

    bool has(const std::string& name) const;
    // Tensors of the file that nothing bound (ignoring MTP layers >= n_layer).
    std::vector<std::string> unused(int64_t n_layer) const;

private:
    const gguf::TensorInfo& find(const std::string& name) const;
    Tensor upload(const gguf::TensorInfo& ti);
    void check_shape(const gguf::TensorInfo& ti, std::initializer_list<int64_t> ne) const;

    const gguf::File& f_;
    Backend* be_ = nullptr;
    std::set<std::string> bound_;
};

}  // namespace qinfer
