// libFuzzer target for the GGUF reader (scripts/fuzz.sh runs it).
// Properties checked on every input:
//  * parse_memory either throws qinfer::Error or returns a File (no crash, no
//    other exception, no read outside the input: ASan sees to that);
//  * every getter and array accessor on an accepted file either works or
//    throws qinfer::Error;
//  * an accepted file re-encoded by the writer parses again to the same keys,
//    tensor shapes and tensor bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

using namespace qinfer;

namespace {

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "gguf_fuzz: property violated: %s\n", what);
    std::abort();
}

uint64_t touch(const gguf::File& f) {
    uint64_t sink = 0;
    for (const gguf::KeyValue& kv : f.metadata()) {
        try { sink += f.get_uint(kv.key).value_or(0); } catch (const Error&) {}
        try { sink += uint64_t(f.get_int(kv.key).value_or(0)); } catch (const Error&) {}
        try { sink += uint64_t(f.get_float(kv.key).value_or(0) != 0); } catch (const Error&) {}
        try { sink += f.get_bool(kv.key).value_or(false); } catch (const Error&) {}
        try { sink += f.get_string(kv.key).value_or("").size(); } catch (const Error&) {}
        try {
            if (const auto* a = f.get_string_array(kv.key))
                for (std::string_view s : *a) sink += s.empty() ? 0 : uint8_t(s.back());
        } catch (const Error&) {}
        const gguf::Value& v = kv.value;
        if (v.is_array())
            for (uint64_t i = 0; i < v.count && i < 64; ++i) {
                try { sink += uint64_t(v.int_at(i)); } catch (const Error&) {}
                try { sink += uint64_t(v.float_at(i) != 0); } catch (const Error&) {}
            }
    }
    for (const gguf::TensorInfo& t : f.tensors()) {
        if (f.find_tensor(t.name) != &t) die("find_tensor does not find a tensor by its name");
        if (t.nbytes) sink += t.data[0] + t.data[t.nbytes - 1];
    }
    return sink;
}

void round_trip(const gguf::File& f) {
    gguf::Writer w;
    w.copy_metadata(f);
    for (const gguf::TensorInfo& t : f.tensors())
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne, t.n_dims), t.data);
    std::vector<uint8_t> bytes = w.to_bytes();
    std::unique_ptr<gguf::File> g;
    try {
        g = gguf::File::parse_memory(bytes.data(), bytes.size(), "rewritten");
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        die("the writer's output of an accepted file does not parse");
    }
    if (g->metadata().size() != f.metadata().size() || g->tensors().size() != f.tensors().size())
        die("key or tensor count changed in the round trip");
    for (size_t i = 0; i < f.metadata().size(); ++i)
        if (g->metadata()[i].key != f.metadata()[i].key || g->metadata()[i].value.type != f.metadata()[i].value.type)
            die("key changed in the round trip");
    for (size_t i = 0; i < f.tensors().size(); ++i) {
        const auto &a = f.tensors()[i], &b = g->tensors()[i];
        if (a.name != b.name || a.type != b.type || a.nbytes != b.nbytes || std::memcmp(a.ne, b.ne, sizeof a.ne) != 0)
            die("tensor info changed in the round trip");
        if (a.nbytes && std::memcmp(a.data, b.data, a.nbytes) != 0) die("tensor data changed in the round trip");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<gguf::File> f;
    try {
        f = gguf::File::parse_memory(data, size, "fuzz.gguf");
    } catch (const Error&) {
        return 0;
    }
    volatile uint64_t sink = touch(*f);
    (void)sink;
    try {
        round_trip(*f);
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        die("the writer rejected a file the reader accepted");
    }
    return 0;
}
