// Bad input to the model gives a clear Error and leaves the state untouched:
// context overflow, malformed batches, missing / mis-shaped / mistyped tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/model.h"
#include "testutil.h"

namespace qinfer {
namespace {

const char* kModel = "tiny-qwen3.q4_k_m.gguf";

ModelOptions options(int n_ctx = 16) {
    ModelOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_batch = 16;
    opt.n_slots = 2;
    opt.n_threads = 1;
    return opt;
}

Batch prompt(int n, int pos0 = 0, int slot = 0) {
    Batch b;
    for (int i = 0; i < n; ++i) b.add(100 + pos0 + i, pos0 + i, slot, true);  // token depends on position
    return b;
}

std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

class ModelErrors : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::reference_available()) GTEST_SKIP() << "reference data not available";
    }
};

TEST_F(ModelErrors, ContextOverflowIsAnErrorWithoutStateChange) {
    auto m = Model::load(test::reference_path(kModel), options(16));
    std::vector<float> logits;
    m->forward(prompt(10), logits);
    const std::vector<float> after10 = logits;
    std::string err = error_of([&] { m->forward(prompt(7, 10), logits); });
    EXPECT_NE(err.find("context"), std::string::npos) << err;
    EXPECT_EQ(m->slot_length(0), 10);
    // The slot still works: filling it exactly to n_ctx is fine, and gives
    // what one uninterrupted run gives.
    m->forward(prompt(6, 10), logits);
    EXPECT_EQ(m->slot_length(0), 16);
    auto fresh = Model::load(test::reference_path(kModel), options(16));
    std::vector<float> all;
    fresh->forward(prompt(16), all);
    const size_t V = size_t(m->hparams().n_vocab);
    ASSERT_EQ(all.size(), 16 * V);
    for (size_t i = 0; i < 6 * V; ++i) ASSERT_NEAR(logits[i], all[10 * V + i], 1e-3f);
    EXPECT_NE(error_of([&] { m->forward(prompt(1, 16), logits); }).find("context"), std::string::npos);
}

TEST_F(ModelErrors, MalformedBatchesAreRejected) {
    auto m = Model::load(test::reference_path(kModel), options(16));
    std::vector<float> logits;
    m->forward(prompt(3), logits);
    EXPECT_NE(error_of([&] { m->forward(prompt(2, 5), logits); }).find("position"), std::string::npos);
    EXPECT_NE(error_of([&] { m->forward(prompt(2, 0, 7), logits); }).find("slot 7"), std::string::npos);
    Batch gap = prompt(1, 3);
    gap.add(5, 0, 1, true);
    gap.add(6, 4, 0, true);  // slot 0 again after slot 1
    EXPECT_NE(error_of([&] { m->forward(gap, logits); }).find("contiguous"), std::string::npos);
    Batch bad_id;
    bad_id.add(int32_t(m->hparams().n_vocab), 3, 0, true);
    EXPECT_NE(error_of([&] { m->forward(bad_id, logits); }).find("token id"), std::string::npos);
    EXPECT_NE(error_of([&] { m->forward(prompt(17, 3), logits); }).find("n_batch"), std::string::npos);
    EXPECT_NE(error_of([&] { m->forward(Batch{}, logits); }).find("empty"), std::string::npos);
    EXPECT_EQ(m->slot_length(0), 3);
    EXPECT_EQ(m->slot_length(1), 0);
    m->forward(prompt(2, 3), logits);  // still usable
    EXPECT_EQ(m->slot_length(0), 5);
}

// Copies the reference model, letting `edit` drop or replace tensors.
// edit(name) returns: 0 = keep, 1 = drop, 2 = replace with an F32 tensor of `ne`.
std::string broken_copy(const std::string& out_name, const std::string& target, int action,
                        std::vector<int64_t> ne = {}, GgmlType type = GgmlType::F32) {
    auto f = gguf::File::open(test::reference_path(kModel));
    gguf::Writer w;
    w.copy_metadata(*f);
    static std::vector<std::vector<uint8_t>> keep_alive;
    for (const gguf::TensorInfo& ti : f->tensors()) {
        std::vector<int64_t> shape(ti.ne, ti.ne + ti.n_dims);
        if (ti.name != target) {
            w.add_tensor(ti.name, ti.type, shape, ti.data);
        } else if (action == 2) {
            int64_t n = 1;
            for (int64_t x : ne) n *= x;
            keep_alive.emplace_back(size_t(n) * (type == GgmlType::F32 ? 4 : 2), 0);
            w.add_tensor(ti.name, type, ne, keep_alive.back().data());
        }
    }
    std::string path = test::temp_dir() + "/" + out_name;
    w.write(path);
    return path;
}

TEST_F(ModelErrors, MissingTensorIsNamed) {
    std::string path = broken_copy("missing.gguf", "blk.1.attn_k_norm.weight", 1);
    std::string err = error_of([&] { Model::load(path, options()); });
    EXPECT_NE(err.find("blk.1.attn_k_norm.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST_F(ModelErrors, MisshapedTensorNamesExpectedAndActualShape) {
    std::string path = broken_copy("shape.gguf", "blk.2.attn_q.weight", 2, {256, 128});
    std::string err = error_of([&] { Model::load(path, options()); });
    EXPECT_NE(err.find("blk.2.attn_q.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("{256, 128}"), std::string::npos) << err;
    EXPECT_NE(err.find("expected {256, 256}"), std::string::npos) << err;
}

TEST_F(ModelErrors, NormMustBeF32) {
    std::string path = broken_copy("type.gguf", "output_norm.weight", 2, {256}, GgmlType::F16);
    std::string err = error_of([&] { Model::load(path, options()); });
    EXPECT_NE(err.find("output_norm.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("F32"), std::string::npos) << err;
}

TEST_F(ModelErrors, BadOptions) {
    ModelOptions opt = options();
    opt.n_ctx = 0;
    EXPECT_FALSE(error_of([&] { Model::load(test::reference_path(kModel), opt); }).empty());
    opt = options();
    opt.kv_type = GgmlType::Q4_0;
    EXPECT_NE(error_of([&] { Model::load(test::reference_path(kModel), opt); }).find("KV cache type"),
              std::string::npos);
    EXPECT_FALSE(error_of([&] { Model::load(test::reference_path("vocab-qwen3.gguf"), options()); }).empty());
}

}  // namespace
}  // namespace qinfer
