// Self-consistency of the forward pass, per architecture: one prompt batch
// equals token-by-token decode and any chunking of it (spec pitfall 14:
// DeltaNet conv window and state carry-over across batch boundaries); several
// slots in one batch equal separate runs; the thread count does not change the
// output; layers split across two backend instances equal one backend; a slot
// snapshot restores the exact state.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "greedy_steps.h"
#include "testutil.h"

namespace qinfer {
namespace {

// One model per architecture, from the always-present top-level reference set.
const char* kModels[] = {"tiny-qwen35.f16", "tiny-qwen3.q4_k_m", "tiny-qwen2.q8_0"};

const std::vector<int> kPrompt = {2201, 1033, 4179, 1931, 8117, 7364, 7737, 6219, 3439, 1537, 7993, 464,
                                  6386, 7090, 34,   7297, 4363, 3748, 1674, 5200, 501,  365,  416,  150};

std::string model_path(const char* name) { return test::reference_path(std::string(name) + ".gguf"); }

ModelOptions options(int threads = 1) {
    ModelOptions opt;
    opt.n_ctx = 64;
    opt.n_batch = 32;
    opt.n_slots = 3;
    opt.n_threads = threads;
    opt.kv_type = GgmlType::F32;
    return opt;
}

// Runs ids[first, first+n) of one slot, logits for every token.
std::vector<float> run(Model& m, const std::vector<int>& ids, size_t first, size_t n, int slot = 0) {
    Batch b;
    for (size_t i = first; i < first + n; ++i) b.add(ids[i], int32_t(i), slot, true);
    std::vector<float> out;
    m.forward(b, out);
    return out;
}

// Whole prompt in chunks of the given sizes.
std::vector<float> run_chunked(Model& m, const std::vector<int>& ids, const std::vector<size_t>& chunks, int slot = 0) {
    std::vector<float> all;
    size_t pos = 0;
    for (size_t n : chunks) {
        std::vector<float> part = run(m, ids, pos, n, slot);
        all.insert(all.end(), part.begin(), part.end());
        pos += n;
    }
    return all;
}

// The model on two CPU backends: the first half of the layers and the
// embedding on one, the rest and the head on the other.
std::unique_ptr<Model> load_split(const char* name, int64_t n_layer) {
    Placement pl;
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
    for (int64_t il = 0; il < n_layer; ++il) pl.layer.push_back(il < n_layer / 2 ? 0 : 1);
    pl.embed = 0;
    pl.head = 1;
    return Model::load(model_path(name), options(), std::move(pl));
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::fabs(x)));
    return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

int argmax(const float* v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return int(best);
}

std::vector<int> greedy(Model& m, const std::vector<int>& prompt, int n) {
    std::vector<float> lg = run(m, prompt, 0, prompt.size());
    const int64_t V = m.hparams().n_vocab;
    std::vector<int> out = {argmax(&lg[lg.size() - size_t(V)], V)};
    while (int(out.size()) < n) {
        Batch b;
        b.add(out.back(), int32_t(prompt.size() + out.size() - 1), 0, true);
        m.forward(b, lg);
        out.push_back(argmax(lg.data(), V));
    }
    return out;
}

class Consistency : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        if (!test::reference_available()) GTEST_SKIP() << "reference data not available";
    }
};

TEST_P(Consistency, BatchEqualsTokenByTokenAndChunks) {
    auto m = Model::load(model_path(GetParam()), options());
    const size_t n = kPrompt.size();
    const std::vector<float> batch = run(*m, kPrompt, 0, n);
    const double scale = max_abs(batch);

    m->clear_slot(0);
    const std::vector<float> single = run_chunked(*m, kPrompt, std::vector<size_t>(n, 1));
    m->clear_slot(0);
    const std::vector<float> chunked = run_chunked(*m, kPrompt, {1, 2, 3, 5, 13});
    // Only summation order differs (blocked vs vector matmul kernels).
    EXPECT_LE(max_diff(batch, single), 1e-4 * scale) << GetParam();
    EXPECT_LE(max_diff(batch, chunked), 1e-4 * scale) << GetParam();
    EXPECT_EQ(m->slot_length(0), int(n));
}

TEST_P(Consistency, SlotsInOneBatchEqualSeparateRuns) {
    auto m = Model::load(model_path(GetParam()), options());
    const std::vector<int> a(kPrompt.begin(), kPrompt.begin() + 9), b(kPrompt.begin() + 9, kPrompt.end());
    const std::vector<float> ra = run(*m, a, 0, a.size(), 0);
    const std::vector<float> rb = run(*m, b, 0, b.size(), 1);
    m->clear_slot(0);
    m->clear_slot(1);
    // Both prompts in one batch, slot 1 first; logits only where asked.
    Batch batch;
    for (size_t i = 0; i < b.size(); ++i) batch.add(b[i], int32_t(i), 1, i + 1 == b.size());
    for (size_t i = 0; i < a.size(); ++i) batch.add(a[i], int32_t(i), 0, true);
    std::vector<float> both;
    m->forward(batch, both);
    const int64_t V = m->hparams().n_vocab;
    ASSERT_EQ(both.size(), (a.size() + 1) * size_t(V));
    const std::vector<float> got_b(both.begin(), both.begin() + V), want_b(rb.end() - V, rb.end());
    const std::vector<float> got_a(both.begin() + V, both.end());
    EXPECT_LE(max_diff(got_a, ra), 1e-4 * max_abs(ra));
    EXPECT_LE(max_diff(got_b, want_b), 1e-4 * max_abs(rb));
    EXPECT_EQ(m->slot_length(0), int(a.size()));
    EXPECT_EQ(m->slot_length(1), int(b.size()));
}

TEST_P(Consistency, ThreadCountDoesNotChangeGreedy) {
    std::vector<int> first;
    for (int threads : {1, 2, 3}) {
        auto m = Model::load(model_path(GetParam()), options(threads));
        std::vector<int> g = greedy(*m, kPrompt, 6);
        if (first.empty()) first = g;
        EXPECT_EQ(g, first) << threads << " threads";
    }
}

TEST_P(Consistency, SplitAcrossTwoBackendsEqualsOne) {
    auto single = Model::load(model_path(GetParam()), options());
    const std::vector<float> want = run(*single, kPrompt, 0, kPrompt.size());
    const int64_t L = single->hparams().n_layer;

    auto split = load_split(GetParam(), L);
    EXPECT_NE(split->backend_description().find("layers"), std::string::npos) << split->backend_description();
    const std::vector<float> got = run(*split, kPrompt, 0, kPrompt.size());
    EXPECT_EQ(max_diff(got, want), 0.0);
    // Decode steps cross the backends too.
    Batch b;
    b.add(7, int32_t(kPrompt.size()), 0, true);
    std::vector<float> l1, l2;
    single->forward(b, l1);
    split->forward(b, l2);
    EXPECT_EQ(max_diff(l1, l2), 0.0);
}

// Prompt offload with a second CPU instance standing in for the GPU: the
// streamed weights and the shadow state must give exactly the logits of one
// backend, for fresh and continued prompts, several slots in one batch and the
// decode steps after them (which read the state the offloaded steps wrote back).
TEST_P(Consistency, PromptOffloadEqualsOneBackend) {
    const int64_t L = Model::load(model_path(GetParam()), options())->hparams().n_layer;
    for (bool half : {false, true}) {
        auto single = Model::load(model_path(GetParam()), options());
        Placement pl;
        pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
        pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
        for (int64_t il = 0; il < L; ++il) pl.layer.push_back(half && il >= L / 2 ? 1 : 0);
        pl.offload = 1;
        ModelOptions opt = options();
        opt.op_offload_min_batch = 4;
        auto off = Model::load(model_path(GetParam()), opt, std::move(pl));
        EXPECT_NE(off->backend_description().find("prompts of 4+ tokens"), std::string::npos)
            << off->backend_description();

        auto both = [&](const Batch& b) {
            std::vector<float> want, got;
            single->forward(b, want);
            off->forward(b, got);
            EXPECT_EQ(max_diff(got, want), 0.0) << GetParam() << (half ? " half" : " all") << ", " << b.size()
                                                << " tokens at position " << b.pos[0];
        };
        auto chunk = [&](size_t first, size_t n, int slot) {
            Batch b;
            for (size_t i = first; i < first + n; ++i) b.add(kPrompt[i], int32_t(i), slot, true);
            return b;
        };
        both(chunk(0, 10, 0));  // fresh slot
        both(chunk(10, 8, 0));  // continued: the KV rows and state before it go up
        for (size_t i = 18; i < 21; ++i) both(chunk(i, 1, 0));  // decode: stays on its layers
        // Two slots in one batch: a fresh prompt and a continued one.
        Batch two = chunk(0, 5, 1);
        for (size_t i = 21; i < 24; ++i) two.add(kPrompt[i], int32_t(i), 0, true);
        both(two);
        both(chunk(5, 1, 1));
        EXPECT_EQ(off->offloaded_batches(), 3u);
    }
}

// Prompt offload past the first 1024 positions (the KV shadow grows), and a
// batch with more segments than the shadow has slots (runs where the layers
// live): logits still equal one backend's, and only the offloaded batches count.
TEST_P(Consistency, PromptOffloadGrowsItsShadowAndFallsBack) {
    ModelOptions opt = options();
    opt.n_ctx = 1200;
    opt.n_batch = 1100;
    opt.n_slots = 6;
    auto single = Model::load(model_path(GetParam()), opt);
    const int64_t L = single->hparams().n_layer, V = single->hparams().n_vocab;
    Placement pl;
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(1)));
    pl.layer.assign(size_t(L), 0);
    pl.offload = 1;
    ModelOptions oo = opt;
    oo.op_offload_min_batch = 4;
    auto off = Model::load(model_path(GetParam()), oo, std::move(pl));
    auto both = [&](const Batch& b, const char* what) {
        std::vector<float> want, got;
        single->forward(b, want);
        off->forward(b, got);
        EXPECT_EQ(max_diff(got, want), 0.0) << GetParam() << ": " << what;
    };
    Batch b;
    for (int i = 0; i < 1000; ++i) b.add(int32_t(100 + (i * 37) % int(V - 200)), i, 0, i == 999);
    both(b, "1000 tokens");
    b.clear();
    for (int i = 1000; i < 1100; ++i) b.add(int32_t(100 + (i * 37) % int(V - 200)), i, 0, true);
    both(b, "100 more (shadow past 1024 rows)");
    EXPECT_EQ(off->offloaded_batches(), 2u);
    // Six slots in one batch: more than the shadow's four.
    b.clear();
    for (int s = 1; s < 6; ++s)
        for (int i = 0; i < 2; ++i) b.add(kPrompt[size_t(s + i)], i, s, true);
    b.add(7, 1100, 0, true);
    both(b, "six segments");
    EXPECT_EQ(off->offloaded_batches(), 2u);
}

// Greedy picks made by the backend equal the argmax of the logits it returns
// (the same batch on two slots: every row, and only the last).
TEST_P(Consistency, ForwardArgmaxPicksTheLargestLogit) {
    auto m = Model::load(model_path(GetParam()), options());
    const int64_t V = m->hparams().n_vocab;
    Batch b0, b1;
    for (size_t i = 0; i < kPrompt.size(); ++i) {
        b0.add(kPrompt[i], int32_t(i), 0, true);
        b1.add(kPrompt[i], int32_t(i), 1, i % 3 == 0);
    }
    std::vector<float> logits;
    std::vector<int32_t> ids;
    m->forward(b0, logits);
    m->forward_argmax(b1, ids);
    ASSERT_EQ(ids.size(), (kPrompt.size() + 2) / 3);
    for (size_t r = 0; r < ids.size(); ++r)
        EXPECT_EQ(ids[r], argmax(logits.data() + 3 * r * size_t(V), V)) << GetParam() << " row " << 3 * r;
    // The slot moved on as with forward(): the next step continues it.
    Batch next;
    next.add(ids.back(), int32_t(kPrompt.size()), 1, true);
    m->forward_argmax(next, ids);
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_EQ(m->slot_length(1), int(kPrompt.size()) + 1);
}

// Pipelined greedy decoding: steps submitted one ahead, each fed the previous
// step's picks on the backend (chain), give the ids forward_argmax gives one
// step at a time, on one backend and with the embedding and head on two (the
// host then carries the picks over); misuse is an error, not a wrong token.
TEST_P(Consistency, SubmittedChainedStepsEqualForwardArgmax) {
    auto one = Model::load(model_path(GetParam()), options());
    const int64_t L = one->hparams().n_layer;
    auto split = load_split(GetParam(), L);
    const int P = 6, N = 10;
    // Two sequences (slots 0 and 1) from different prompts, decoded together.
    auto prompt = [&](Model& m, std::vector<int32_t>& first) {
        Batch b;
        for (int s = 0; s < 2; ++s)
            for (int i = 0; i < P; ++i) b.add(kPrompt[size_t(s * P + i)], i, s, i == P - 1);
        m.forward_argmax(b, first);
    };
    std::vector<int32_t> first;
    prompt(*one, first);
    ASSERT_EQ(first.size(), 2u);
    const auto want = test::greedy_steps(*one, first, P, N, false);  // one step at a time
    for (Model* m : {one.get(), split.get()}) {
        m->clear_slot(0);
        m->clear_slot(1);
        std::vector<int32_t> f;
        prompt(*m, f);
        ASSERT_EQ(f, first);
        const auto got = test::greedy_steps(*m, f, P, N, true);
        EXPECT_EQ(got, want) << GetParam() << (m == one.get() ? " (one backend)" : " (two backends)");
        EXPECT_EQ(m->slot_length(0), P + N);
    }
    // Misuse.
    std::vector<int32_t> ids;
    EXPECT_THROW(one->collect_argmax(ids), Error);  // nothing submitted
    Batch b3;
    for (int s = 0; s < 3; ++s) b3.add(0, P + N, s, true);
    EXPECT_THROW(one->submit_argmax(b3, true), Error);  // three rows after a step of two
    EXPECT_EQ(one->slot_length(0), P + N);              // and nothing ran
    Batch b2;
    for (int s = 0; s < 2; ++s) b2.add(5, P + N + 0, s, true);
    one->submit_argmax(b2, true);  // the failed step did not end the chain
    b2.pos = {P + N + 1, P + N + 1};
    one->submit_argmax(b2, true);
    b2.pos = {P + N + 2, P + N + 2};
    EXPECT_THROW(one->submit_argmax(b2, true), Error);  // a third uncollected step
    one->collect_argmax(ids);
    one->collect_argmax(ids);
    std::vector<float> logits;
    one->forward(b2, logits);
    b2.pos = {P + N + 3, P + N + 3};
    EXPECT_THROW(one->submit_argmax(b2, true), Error);  // another step ran since
}

// forward_top's candidates are the best logits of the rows forward() returns,
// in the sampler's order (larger first, the lower id among equals), with
// their exact values; a batch that needs several head chunks, too.
TEST_P(Consistency, ForwardTopReturnsTheBestLogits) {
    ModelOptions opt = options();
    opt.n_batch = 70;
    opt.n_ctx = 80;
    auto m = Model::load(model_path(GetParam()), opt);
    const int64_t V = m->hparams().n_vocab;
    Batch b0, b1;  // 70 rows: more than one head chunk of 64
    for (int i = 0; i < 70; ++i) {
        const int32_t tok = int32_t(100 + (i * 37) % int(V - 200));
        b0.add(tok, i, 0, true);
        b1.add(tok, i, 1, true);
    }
    std::vector<float> logits, top;
    std::vector<int32_t> ids;
    m->forward(b0, logits);
    const int n = 40;
    m->forward_top(b1, n, top, ids);
    ASSERT_EQ(ids.size(), 70u * n);
    ASSERT_EQ(top.size(), 70u * n);
    for (size_t r = 0; r < 70; ++r) {
        const float* row = logits.data() + r * size_t(V);
        const std::vector<int32_t> order = test::logit_order(row, V);
        for (int j = 0; j < n; ++j) {
            ASSERT_EQ(ids[r * n + size_t(j)], order[size_t(j)]) << GetParam() << " row " << r << " rank " << j;
            ASSERT_EQ(top[r * n + size_t(j)], row[order[size_t(j)]]);
        }
    }
    EXPECT_EQ(m->slot_length(1), 70);
    EXPECT_THROW(m->forward_top(b1, 0, top, ids), Error);
    EXPECT_THROW(m->forward_top(b1, Model::kMaxTop + 1, top, ids), Error);
}

TEST_P(Consistency, SnapshotRestoresExactState) {
    auto m = Model::load(model_path(GetParam()), options());
    const std::vector<float> prefix = run(*m, kPrompt, 0, 10, 0);
    const std::shared_ptr<const StateStore::Snapshot> snap = m->save_slot(0);
    EXPECT_EQ(snap->length, 10);
    EXPECT_EQ(snap->first, 0);
    const std::vector<float> want = run(*m, kPrompt, 10, 6, 0);
    m->restore_slot(1, *snap);
    EXPECT_EQ(m->slot_length(1), 10);
    const std::vector<float> got = run(*m, kPrompt, 10, 6, 1);
    EXPECT_EQ(max_diff(got, want), 0.0);
    // clear_slot forgets everything: the prompt gives the same logits again.
    m->clear_slot(1);
    EXPECT_EQ(m->slot_length(1), 0);
    EXPECT_EQ(max_diff(run(*m, kPrompt, 0, 10, 1), prefix), 0.0);
}

TEST_P(Consistency, ChainedSnapshotAndKeptRowsRestoreExactState) {
    auto m = Model::load(model_path(GetParam()), options());
    run(*m, kPrompt, 0, 6, 0);
    const std::shared_ptr<const StateStore::Snapshot> a = m->save_slot(0);
    run(*m, kPrompt, 6, 4, 0);
    const std::shared_ptr<const StateStore::Snapshot> whole = m->save_slot(0);
    const std::shared_ptr<const StateStore::Snapshot> b = m->save_slot(0, a);  // rows [6, 10) on top of a
    ASSERT_EQ(b->length, 10);
    EXPECT_EQ(b->first, 6);
    EXPECT_EQ(b->base, a);
    if (m->hparams().n_attention_layers() > 0) {
        EXPECT_LT(b->bytes.size(), whole->bytes.size());
    }
    const std::vector<float> want = run(*m, kPrompt, 10, 6, 0);

    // Into an empty slot: the chain supplies every row.
    m->clear_slot(1);
    m->restore_slot(1, *b);
    EXPECT_EQ(m->slot_length(1), 10);
    EXPECT_EQ(max_diff(run(*m, kPrompt, 10, 6, 1), want), 0.0);

    // Into a slot that already holds the first 8 tokens (and has gone on with
    // other ones): rows [0, 8) are kept, the rest and the state come from b.
    m->clear_slot(2);
    run(*m, kPrompt, 0, 8, 2);
    Batch other;
    other.add(99, 8, 2, false);
    other.add(98, 9, 2, false);
    other.add(97, 10, 2, false);
    std::vector<float> unused;
    m->forward(other, unused);
    m->restore_slot(2, *b, 8);
    EXPECT_EQ(m->slot_length(2), 10);
    EXPECT_EQ(max_diff(run(*m, kPrompt, 10, 6, 2), want), 0.0);

    // A piece that does not fit this model's layout is refused before anything is written.
    auto bad = std::make_shared<StateStore::Snapshot>(*b);
    bad->bytes.pop_back();
    EXPECT_THROW(m->restore_slot(1, *bad), Error);
    auto orphan = std::make_shared<StateStore::Snapshot>(*b);
    orphan->base.reset();
    EXPECT_THROW(m->restore_slot(1, *orphan), Error);
}

INSTANTIATE_TEST_SUITE_P(Archs, Consistency, ::testing::ValuesIn(kModels), [](const auto& info) {
    std::string s = info.param;
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
});

}  // namespace
}  // namespace qinfer
