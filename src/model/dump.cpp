#include "model/dump.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "common/platform.h"

namespace qinfer {

std::unique_ptr<Dumper> Dumper::from_env() {
    const char* dir = std::getenv("QINFER_DUMP");
    if (!dir || !*dir) return nullptr;
    return std::make_unique<Dumper>(dir);
}

Dumper::Dumper(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) fail(strfmt("QINFER_DUMP: cannot create '%s': %s", dir_.c_str(), ec.message().c_str()));
}

void Dumper::write(int layer, const char* name, const Tensor& t) {
    if (t.type != GgmlType::F32) return;
    // Gather the (possibly strided) rows into one host buffer.
    std::vector<float> host(size_t(t.n_elements()));
    t.backend->synchronize();
    for (int64_t r = 0; r < t.n_rows(); ++r) {
        const int64_t i1 = r % t.ne[1], rest = r / t.ne[1];
        size_t off = size_t(i1) * t.nb[1] + size_t(rest % t.ne[2]) * t.nb[2] + size_t(rest / t.ne[2]) * t.nb[3];
        t.backend->read(t, &host[size_t(r * t.ne[0])], size_t(t.ne[0]) * 4, off);
    }
    const std::string lname = layer < 0 ? "head" : std::to_string(layer);
    const std::string base = std::to_string(call_) + "." + lname + "." + name;
    if (FILE* f = utf8_fopen(dir_ + "/" + base + ".f32", "wb")) {
        std::fwrite(host.data(), 4, host.size(), f);
        std::fclose(f);
    }
    if (FILE* f = utf8_fopen(dir_ + "/index.txt", "a")) {
        std::fprintf(f, "%s %s\n", base.c_str(), shape_str(t).c_str());
        std::fclose(f);
    }
}

}  // namespace qinfer
