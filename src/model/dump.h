// Named intermediates to files, for tracing a wrong logit to the first tensor
// that diverges. Enabled by QINFER_DUMP=<dir>: each recorded tensor is written
// as raw little-endian f32 to <dir>/<call>.<layer>.<name>.f32 (layer "head" for
// the output stage), with its shape appended to <dir>/index.txt. Reading back
// device data mid-step is slow and breaks graph capture: debugging only.
#pragma once
#include <cstdio>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace qinfer {

class Dumper {
public:
    static std::unique_ptr<Dumper> from_env();  // nullptr when QINFER_DUMP is unset
    explicit Dumper(std::string dir);
    void begin_call() { ++call_; }
    void write(int layer, const char* name, const Tensor& t);

private:
    std::string dir_;
    int call_ = -1;
};

}  // namespace qinfer
