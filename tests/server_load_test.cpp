// Bounded load on an in-process server: 64 concurrent streaming clients for
// a few seconds against 8 slots. Every request must complete with a
// well-formed stream and, with greedy sampling, the same tokens as the same
// prompt alone; afterwards nothing is queued or active and the process
// memory is back near its level after a warm-up round.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "server/loadgen.h"
#include "server/server.h"
#include "testutil.h"

using namespace qinfer;

namespace {

// Resident set size in bytes (Linux); 0 elsewhere.
uint64_t rss_bytes() {
#if defined(__linux__)
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long pages = 0, resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &pages, &resident);
    std::fclose(f);
    return n == 2 ? uint64_t(resident) * 4096u : 0;
#else
    return 0;
#endif
}

}  // namespace

TEST(ServerLoad, SixtyFourStreamingClients) {
    const std::string path = test::reference_path("tiny-qwen35.q4_k_m.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    server::ServerOptions o;
    o.model_path = path;
    o.port = 0;
    o.engine.n_ctx = 256;
    o.engine.n_slots = 8;
    o.engine.n_batch = 128;
    o.engine.n_threads = 1;  // the CI machine is small and shared: one thread avoids oversubscription
    o.queue_size = 64;
    o.cache_bytes = 8u << 20;
    server::Server s(o);
    const int port = s.start();

    server::LoadOptions lo;
    lo.port = port;
    lo.clients = 64;
    lo.max_tokens = 12;
    lo.duration_s = 2;

    // Reference outputs: each prompt alone.
    server::LoadOptions one = lo;
    one.clients = 1;
    one.duration_s = 0.01;
    std::map<std::string, std::vector<int32_t>> want;
    for (int i = 0; i < 8; i++) {
        one.prompts = {strfmt("<|im_start|>user\nWrite a short poem about the number %d.<|im_end|>\n<|im_start|>assistant\n", i * 37 + 5)};
        const server::LoadResult r = server::run_load(one);
        ASSERT_EQ(r.requests_failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
        want.insert(r.outputs.begin(), r.outputs.end());
    }
    ASSERT_EQ(want.size(), 8u);

    const server::LoadResult warm = server::run_load(lo);  // warm-up: thread stacks, allocator arenas, cache
    ASSERT_EQ(warm.requests_failed, 0) << (warm.errors.empty() ? "" : warm.errors[0]);
    const uint64_t rss_base = rss_bytes();

    lo.duration_s = 8;
    const server::LoadResult r = server::run_load(lo);
    std::printf("load: %s\n", r.summary().c_str());
    for (const std::string& e : r.errors) std::printf("  error: %s\n", e.c_str());
    EXPECT_EQ(r.requests_failed, 0);
    EXPECT_EQ(r.mismatches, 0);
    EXPECT_GT(r.repeats, 0) << "prompts were repeated, so the comparison ran";
    EXPECT_GE(r.requests_ok, 64);
    EXPECT_EQ(r.tokens, r.requests_ok * 12);
    EXPECT_GT(r.stream_decode_p50, 0) << "every token streams in its own chunk (return_tokens)";
    for (const auto& [prompt, tokens] : r.outputs) {
        ASSERT_TRUE(want.count(prompt));
        EXPECT_EQ(tokens, want[prompt]) << "batched output differs from the prompt alone";
    }

    // Everything drained; memory back near the warm baseline.
    EXPECT_EQ(s.metrics().active_sequences.load(), 0);
    EXPECT_EQ(s.metrics().queue_depth.load(), 0);
    EXPECT_LE(s.metrics().cache_bytes.load(), o.cache_bytes);
    const uint64_t rss_after = rss_bytes();
    if (rss_base > 0) {
        std::printf("rss: %.1f MiB after warm-up, %.1f MiB after load\n", rss_base / 1048576.0, rss_after / 1048576.0);
        EXPECT_LT(rss_after, rss_base + (48u << 20)) << "memory did not return to baseline";
    }
    s.stop();
}
