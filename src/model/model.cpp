// Model::load and the forward walk shared by all architectures: embedding,
// layers on their backends (one hidden-state copy where the backend changes),
// final norm and LM head for the requested rows. The per-layer math lives in
// qwen2.cpp / qwen3.cpp / qwen35.cpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <set>

#include "common/error.h"
#include "common/platform.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "model/dump.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/offload.h"
#include "plan/planner.h"

namespace qinfer {

const ArchDef& arch_def(Arch a) {
    switch (a) {
        case Arch::Qwen2: return qwen2_arch();
        case Arch::Qwen3: return qwen3_arch();
        case Arch::Qwen35: return qwen35_arch();
    }
    fail("model: unknown architecture");
}

namespace {

// Steps of more tokens (prompt chunks) run as issued, never recorded as step
// graphs: recording a 512-token step cost ~11 ms once and replays saved ~0.5 ms
// each (pp512 repetitions 14.3k then 20.8k tok/s, unrecorded 20.3k throughout,
// on an H200), prompt shapes seldom repeat, and every recording takes one of
// the backend's graph slots that decode batches need.
constexpr int64_t kGraphMaxTokens = 64;

class TransformerModel final : public Model {
public:
    TransformerModel(std::unique_ptr<gguf::File> file, const ModelOptions& opt, Placement placement);

    const HParams& hparams() const override { return hp_; }
    const gguf::File& file() const override { return *file_; }
    const ModelOptions& options() const override { return opt_; }
    void forward(const Batch& batch, std::vector<float>& logits) override { step(batch, {&logits, nullptr, 0}); }
    void forward_argmax(const Batch& batch, std::vector<int32_t>& ids) override { step(batch, {nullptr, &ids, 0}); }
    void submit_argmax(const Batch& batch, bool chain) override;
    void collect_argmax(std::vector<int32_t>& ids) override;
    int uncollected() const override { return int(submitted_.size()); }
    void forward_top(const Batch& batch, int n, std::vector<float>& logits, std::vector<int32_t>& ids) override {
        if (n < 1 || n > kMaxTop) fail(strfmt("model: %d candidates per row (1..%d)", n, kMaxTop));
        step(batch, {&logits, &ids, int(std::min<int64_t>(n, hp_.n_vocab))});
    }
    void clear_slot(int slot) override { state_->clear(slot); }
    int slot_length(int slot) const override {
        check_slot(slot);
        return state_->length(slot);
    }
    std::shared_ptr<const StateStore::Snapshot> save_slot(
        int slot, std::shared_ptr<const StateStore::Snapshot> base = nullptr) const override {
        return state_->save(slot, std::move(base));
    }
    void restore_slot(int slot, const StateStore::Snapshot& snap, int keep = 0) override {
        state_->restore(slot, snap, keep);
    }
    std::string backend_description() const override;
    uint64_t offloaded_batches() const override { return offloaded_batches_; }
    bool layers_on_host() const override {
        for (int bi : placement_.layer)
            if (!backend(bi).host_memory()) return false;
        return true;
    }
    bool offloads_prompts() const override { return offload_ != nullptr; }

private:
    struct PerBackend {
        Scratch s;
        StepInfo step;
        Tensor ids;      // I32 [n_batch]: token ids (embed backend)
        Tensor rows;     // I32 [n_batch]: batch rows that get logits (head backend)
        Tensor xo;       // [E, kHeadChunk] rows for the head
        Tensor logits;   // [V, kHeadChunk]
        Tensor picks;    // I32 [kHeadChunk]: argmax of each logits row (forward_argmax)
        Tensor top_logits, top_ids;  // F32 / I32 [kMaxTop * kHeadChunk]: best logits per row (forward_top)
    };

    void check_slot(int slot) const {
        if (slot < 0 || slot >= opt_.n_slots)
            fail(strfmt("model: slot %d out of range (0..%d)", slot, opt_.n_slots - 1));
    }
    std::vector<StepInfo::Segment> validate(const Batch& batch) const;
    void alloc_scratch(int bi, bool attn, bool rec);
    // What the head sends back: whole rows of logits, argmax ids, or (top > 0)
    // the best `top` logits of each row and their ids.
    struct HeadOut {
        std::vector<float>* logits;
        std::vector<int32_t>* ids;
        int top;
        bool submit = false;  // ids by read_async into submitted_ (ids is null)
        bool chain = false;   // tokens from the last submitted step's picks
    };
    void step(const Batch& batch, HeadOut out);
    void prepare_step(int bi, const Batch& batch, const std::vector<StepInfo::Segment>& segs);
    Backend& backend(int bi) const { return *placement_.backends[size_t(bi)]; }

    std::unique_ptr<gguf::File> file_;
    HParams hp_;
    ModelOptions opt_;
    Placement placement_;
    const ArchDef& arch_;
    Tensor token_embd_, output_norm_, output_, output_b_;
    std::vector<LayerWeights> layers_;
    std::unique_ptr<StateStore> state_;
    std::vector<PerBackend> pb_;
    std::vector<bool> used_;  // backend index is used by this model
    std::unique_ptr<Dumper> dumper_;
    std::unique_ptr<PromptOffload> offload_;
    uint64_t offloaded_batches_ = 0;

    // submit_argmax's steps in submission order: the head backend's read of
    // their picks, or the ids once the host has them.
    struct Submitted {
        uint64_t ticket = 0;
        std::vector<int32_t> ids;
        bool have_ids = false;
    };
    std::deque<Submitted> submitted_;
    // Rows of the latest step if it was a submit_argmax (its picks are still in
    // the head's buffer and may feed a chained step), else -1; the host copy of
    // those picks once collected.
    int64_t chainable_rows_ = -1;
    std::vector<int32_t> last_picks_;
    void take_ids(Submitted& s);

    // QINFER_STEP_TIMES=1: wall time per backend run (CPU runs compute as they
    // are issued; a GPU run's time is mostly the wait for its results at the
    // next hand-over or logits read), printed when the model is destroyed.
    struct RunTimes {
        double seconds = 0;
        uint64_t runs = 0;
    };
    bool time_runs_ = false;
    std::map<std::string, RunTimes> run_times_;  // "decode CPU", "prompt CUDA0", ...
    uint64_t timed_steps_[2] = {0, 0};            // decode (T <= 8), prompt

public:
    ~TransformerModel() override;
};

TransformerModel::~TransformerModel() {
    if (!time_runs_ || run_times_.empty()) return;
    std::fprintf(stderr, "step times (QINFER_STEP_TIMES): %llu decode steps, %llu prompt steps\n",
                 (unsigned long long)timed_steps_[0], (unsigned long long)timed_steps_[1]);
    for (const auto& [name, t] : run_times_) {
        const uint64_t steps = timed_steps_[name.find("decode") == 0 ? 0 : 1];
        std::fprintf(stderr, "  %-28s %9.3f ms per step (%llu runs)\n", name.c_str(),
                     1e3 * t.seconds / double(std::max<uint64_t>(steps, 1)), (unsigned long long)t.runs);
    }
}

TransformerModel::TransformerModel(std::unique_ptr<gguf::File> file, const ModelOptions& opt, Placement placement)
    : file_(std::move(file)),
      hp_(HParams::from_gguf(*file_)),
      opt_(opt),
      placement_(std::move(placement)),
      arch_(arch_def(hp_.arch)) {
    const std::string& path = file_->path();
    if (opt_.n_ctx <= 0 || opt_.n_slots <= 0 || opt_.n_batch <= 0)
        fail(strfmt("model: %s: n_ctx, n_slots and n_batch must be positive", path.c_str()));
    const size_t nb = placement_.backends.size();
    auto valid = [&](int i) { return i >= 0 && size_t(i) < nb && placement_.backends[size_t(i)]; };
    if (placement_.layer.size() != size_t(hp_.n_layer) || !valid(placement_.embed) || !valid(placement_.head) ||
        !std::all_of(placement_.layer.begin(), placement_.layer.end(), valid))
        fail(strfmt("model: %s: placement does not cover the %lld layers", path.c_str(), (long long)hp_.n_layer));

    // Weights, each on the backend that uses it.
    const int64_t E = hp_.n_embd, V = hp_.n_vocab;
    WeightBinder b(*file_);
    b.set_backend(&backend(placement_.embed));
    token_embd_ = b.matrix("token_embd.weight", E, V);
    b.set_backend(&backend(placement_.head));
    output_norm_ = b.f32("output_norm.weight", {E});
    output_ = hp_.tied_output ? Tensor{} : b.matrix("output.weight", E, V);
    output_b_ = b.optional_f32("output.bias", {V});
    if (!output_) {
        // Tied head: the embedding matrix, uploaded again if the head lives elsewhere.
        output_ = placement_.head == placement_.embed ? token_embd_ : b.matrix("token_embd.weight", E, V);
    }
    layers_.resize(size_t(hp_.n_layer));
    for (int il = 0; il < int(hp_.n_layer); ++il) {
        b.set_backend(&backend(placement_.layer[size_t(il)]));
        arch_.bind_layer(b, hp_, il, layers_[size_t(il)]);
    }
    for (const std::string& name : b.unused(hp_.n_layer))
        std::fprintf(stderr, "warning: %s: tensor '%s' is not used by the %s model\n", path.c_str(), name.c_str(),
                     hp_.arch_str.c_str());

    // State and scratch.
    std::vector<Backend*> lb;
    for (int i : placement_.layer) lb.push_back(&backend(i));
    state_ = std::make_unique<StateStore>(hp_, StateConfig{opt_.n_ctx, opt_.n_slots, opt_.kv_type}, lb);
    pb_.resize(nb);
    used_.assign(nb, false);
    std::vector<bool> attn(nb, false), rec(nb, false);
    for (int il = 0; il < int(hp_.n_layer); ++il) {
        size_t bi = size_t(placement_.layer[size_t(il)]);
        used_[bi] = true;
        (hp_.is_recurrent(il) ? rec : attn)[bi] = true;
    }
    used_[size_t(placement_.embed)] = used_[size_t(placement_.head)] = true;

    // Prompt offload: best effort. Without room for its buffers the model
    // runs every layer where it lives.
    if (placement_.offload >= 0 && opt_.op_offload_min_batch > 0) {
        if (!valid(placement_.offload)) fail(strfmt("model: %s: offload backend out of range", path.c_str()));
        const size_t ti = size_t(placement_.offload);
        try {
            offload_ = std::make_unique<PromptOffload>(backend(int(ti)), hp_, state_->config(), opt_.n_batch,
                                                       opt_.op_offload_min_batch, layers_, lb);
            if (offload_->streams_attention() || offload_->streams_recurrent()) {
                attn[ti] = attn[ti] || offload_->streams_attention();
                rec[ti] = rec[ti] || offload_->streams_recurrent();
                used_[ti] = true;
            } else {
                offload_.reset();
            }
        } catch (const Error& e) {
            offload_.reset();
            std::fprintf(stderr, "warning: prompt offload off: %s\n", e.what());
        }
    }
    for (size_t bi = 0; bi < nb; ++bi)
        if (used_[bi]) alloc_scratch(int(bi), attn[bi], rec[bi]);
    dumper_ = Dumper::from_env();
    const char* st = std::getenv("QINFER_STEP_TIMES");
    time_runs_ = st && *st && std::string(st) != "0";
}

void TransformerModel::alloc_scratch(int bi, bool attn, bool rec) {
    Backend& be = backend(bi);
    PerBackend& p = pb_[size_t(bi)];
    Scratch& s = p.s;
    const int64_t B = opt_.n_batch, E = hp_.n_embd, d = hp_.head_dim;
    s.x = be.alloc(GgmlType::F32, {E, B}, "x");
    s.h = be.alloc(GgmlType::F32, {E, B}, "h");
    s.mix = be.alloc(GgmlType::F32, {E, B}, "mix");
    s.ffn_g = be.alloc(GgmlType::F32, {hp_.n_ff, B}, "ffn_g");
    s.ffn_u = be.alloc(GgmlType::F32, {hp_.n_ff, B}, "ffn_u");
    if (attn) {
        const bool gated = hp_.arch == Arch::Qwen35;
        s.q = be.alloc(GgmlType::F32, {(gated ? 2 : 1) * hp_.n_head * d, B}, "q");
        if (gated) s.qn = be.alloc(GgmlType::F32, {hp_.n_head * d, B}, "qn");
        s.k = be.alloc(GgmlType::F32, {hp_.n_head_kv * d, B}, "k");
        s.v = be.alloc(GgmlType::F32, {hp_.n_head_kv * d, B}, "v");
        s.att = be.alloc(GgmlType::F32, {hp_.n_head * d, B}, "att");
    }
    if (rec) {
        const int64_t C = hp_.ssm_conv_channels(), Dv = hp_.ssm_inner, Hv = hp_.ssm_v_heads;
        s.qkv = be.alloc(GgmlType::F32, {C, B}, "qkv");
        s.conv = be.alloc(GgmlType::F32, {C, B}, "conv");
        s.z = be.alloc(GgmlType::F32, {Dv, B}, "z");
        s.o = be.alloc(GgmlType::F32, {Dv, B}, "o");
        s.y = be.alloc(GgmlType::F32, {Dv, B}, "y");
        s.a = be.alloc(GgmlType::F32, {Hv, B}, "a");
        s.b = be.alloc(GgmlType::F32, {Hv, B}, "b");
    }
    p.step.pos_t = be.alloc(GgmlType::I32, {B}, "pos");
    p.step.slot_t = be.alloc(GgmlType::I32, {B}, "slot");
    p.step.seg_t = be.alloc(GgmlType::I32, {4, B}, "segments");
    p.ids = be.alloc(GgmlType::I32, {B}, "ids");
    if (bi == placement_.head) {
        p.rows = be.alloc(GgmlType::I32, {B}, "logit_rows");
        p.xo = be.alloc(GgmlType::F32, {E, kHeadChunk}, "head_in");
        p.logits = be.alloc(GgmlType::F32, {hp_.n_vocab, kHeadChunk}, "logits");
        p.picks = be.alloc(GgmlType::I32, {kHeadChunk}, "argmax_ids");
        p.top_logits = be.alloc(GgmlType::F32, {kMaxTop * kHeadChunk}, "top_logits");
        p.top_ids = be.alloc(GgmlType::I32, {kMaxTop * kHeadChunk}, "top_ids");
    }
}

std::vector<StepInfo::Segment> TransformerModel::validate(const Batch& batch) const {
    const size_t T = batch.size();
    if (T == 0) fail("model: empty batch");
    if (batch.pos.size() != T || batch.slot.size() != T || batch.want_logits.size() != T)
        fail("model: batch arrays (tokens, pos, slot, want_logits) differ in length");
    if (T > size_t(opt_.n_batch))
        fail(strfmt("model: batch of %zu tokens exceeds n_batch %d", T, opt_.n_batch));
    std::vector<StepInfo::Segment> segs;
    std::set<int32_t> seen;
    for (size_t t = 0; t < T; ++t) {
        if (batch.tokens[t] < 0 || batch.tokens[t] >= hp_.n_vocab)
            fail(strfmt("model: token id %d out of range (vocabulary of %lld)", batch.tokens[t],
                        (long long)hp_.n_vocab));
        const int32_t s = batch.slot[t];
        check_slot(s);
        if (segs.empty() || segs.back().slot != s) {
            if (!seen.insert(s).second) fail(strfmt("model: tokens of slot %d are not contiguous in the batch", s));
            segs.push_back({int32_t(t), 0, s, batch.pos[t]});
        }
        StepInfo::Segment& sg = segs.back();
        if (batch.pos[t] != sg.pos0 + sg.count)
            fail(strfmt("model: slot %d: position %d does not follow %d", s, batch.pos[t], sg.pos0 + sg.count - 1));
        ++sg.count;
    }
    for (const StepInfo::Segment& sg : segs) {
        if (sg.pos0 != state_->length(sg.slot))
            fail(strfmt("model: slot %d holds %d tokens, but the batch continues at position %d", sg.slot,
                        state_->length(sg.slot), sg.pos0));
        if (sg.pos0 + sg.count > opt_.n_ctx)
            fail(strfmt("model: context full: slot %d holds %d tokens, %d more exceed n_ctx %d", sg.slot, sg.pos0,
                        sg.count, opt_.n_ctx));
    }
    return segs;
}

void TransformerModel::prepare_step(int bi, const Batch& batch, const std::vector<StepInfo::Segment>& segs) {
    Backend& be = backend(bi);
    StepInfo& st = pb_[size_t(bi)].step;
    st.n_tokens = int(batch.size());
    st.pos = batch.pos;
    st.slot = batch.slot;
    st.segments = segs;
    be.write(st.pos_t, st.pos.data(), st.pos.size() * 4);
    be.write(st.slot_t, st.slot.data(), st.slot.size() * 4);
    be.write(st.seg_t, st.segments.data(), st.segments.size() * sizeof(StepInfo::Segment));
}

void TransformerModel::step(const Batch& batch, HeadOut out) {
    const int top = out.top;
    std::vector<float>* logits = top ? nullptr : out.logits;
    std::vector<int32_t>* ids = top ? nullptr : out.ids;
    const bool picks = ids || out.submit;  // the head's argmax runs
    const std::vector<StepInfo::Segment> segs = validate(batch);
    const int T = int(batch.size());
    const int64_t V = hp_.n_vocab;
    std::vector<int32_t> rows;  // tokens whose logits are wanted
    for (int t = 0; t < T; ++t)
        if (batch.want_logits[size_t(t)]) rows.push_back(t);
    const int64_t n_out = int64_t(rows.size());
    if (dumper_) dumper_->begin_call();

    // 1. Inputs. Everything that changes from step to step is written before
    //    the first op, into buffers whose addresses never change.
    if (out.submit && n_out > kHeadChunk)
        fail(strfmt("model: %lld rows of ids in one submitted step (at most %d)", (long long)n_out, kHeadChunk));
    if (out.submit && int(submitted_.size()) >= kMaxSubmitted)
        fail(strfmt("model: %d steps submitted and not collected (at most %d)", int(submitted_.size()), kMaxSubmitted));
    if (out.chain && (chainable_rows_ != T || n_out != T))
        fail(strfmt("model: a chained step of %d tokens (%lld want logits) after a step of %lld rows", T,
                    (long long)n_out, (long long)chainable_rows_));
    chainable_rows_ = -1;  // from here on, this step's head overwrites the picks
    for (size_t bi = 0; bi < pb_.size(); ++bi)
        if (used_[bi]) prepare_step(int(bi), batch, segs);
    if (out.chain) {
        if (placement_.embed == placement_.head) {
            // The device copies them: the host need not have seen these tokens.
            Backend& be = backend(placement_.embed);
            be.copy(view(pb_[size_t(placement_.head)].picks, {T}, {}), view(pb_[size_t(placement_.embed)].ids, {T}, {}));
        } else {
            if (!submitted_.empty()) take_ids(submitted_.back());
            const std::vector<int32_t>& prev = submitted_.empty() ? last_picks_ : submitted_.back().ids;
            backend(placement_.embed).write(pb_[size_t(placement_.embed)].ids, prev.data(), size_t(T) * 4);
        }
    } else {
        backend(placement_.embed).write(pb_[size_t(placement_.embed)].ids, batch.tokens.data(), size_t(T) * 4);
    }
    if (n_out > 0) backend(placement_.head).write(pb_[size_t(placement_.head)].rows, rows.data(), size_t(n_out) * 4);

    // 2. Ops. Each run of consecutive stages on one backend is one step graph
    //    that the backend may record once per batch shape and replay; only the
    //    hidden state crosses between runs. No graphs while dumping, or when the
    //    head needs several chunks (a read inside the step).
    const bool offload = offload_ && !dumper_ && offload_->begin(batch.pos, segs);
    const bool graphs = !dumper_ && !offload && n_out <= kHeadChunk;
    const bool record = T <= kGraphMaxTokens;
    const uint64_t shape = uint64_t(T) | uint64_t(segs.size()) << 20 | uint64_t(n_out) << 40 |
                           uint64_t(top) << 47 | uint64_t(picks ? 1 : 0) << 63;  // n_out <= 64, top <= 256
    int cur = -1, run = 0;
    bool issue = true;  // false: the backend replays a recording of this run
    auto t_run = std::chrono::steady_clock::now();
    const char* kind = T <= 8 ? "decode " : "prompt ";
    auto end_run = [&] {
        if (!time_runs_ || cur < 0) return;
        const auto now = std::chrono::steady_clock::now();
        RunTimes& rt = run_times_[std::string(kind) + backend(cur).name()];
        rt.seconds += std::chrono::duration<double>(now - t_run).count();
        ++rt.runs;
        t_run = now;
    };
    auto enter = [&](int bi) {
        if (bi == cur) return;
        if (cur >= 0) {
            if (graphs) backend(cur).end_graph();
            copy_between(first_rows(pb_[size_t(cur)].s.x, T), first_rows(pb_[size_t(bi)].s.x, T));
            end_run();
        }
        cur = bi;
        issue = !graphs || backend(bi).begin_graph(shape ^ (uint64_t(run++) << 56), record);
    };

    // An error inside a step (a kernel, a buffer) leaves no half-recorded step behind.
    struct AbortOnThrow {
        TransformerModel* m;
        bool armed = true;
        ~AbortOnThrow() {
            if (armed)
                for (size_t bi = 0; bi < m->pb_.size(); ++bi) m->backend(int(bi)).abort_graph();
        }
    } abort_guard{this};
    enter(placement_.embed);
    if (issue) backend(cur).get_rows(token_embd_, view(pb_[size_t(cur)].ids, {T}, {}), first_rows(pb_[size_t(cur)].s.x, T));
    for (int il = 0; il < int(hp_.n_layer); ++il) {
        const bool streamed = offload && offload_->streams(il);
        enter(streamed ? placement_.offload : placement_.layer[size_t(il)]);
        if (!issue) continue;
        PerBackend& p = pb_[size_t(cur)];
        if (streamed) {
            // This layer's weights go over the bus while the previous one computes.
            const LayerWeights& w = offload_->stage(il);
            offload_->store_state(*state_);
            const PromptOffload::LayerState ls = offload_->load_state(il, *state_);
            const LayerCtx c{backend(cur), hp_, p.s, offload_->step(), ls.kv, ls.rs, il, T, dumper_.get()};
            arch_.forward_layer(c, w);
        } else {
            const LayerCtx c{backend(cur), hp_, p.s, p.step, state_->kv(il), state_->rs(il), il, T, dumper_.get()};
            arch_.forward_layer(c, layers_[size_t(il)]);
        }
    }
    if (offload) {
        offload_->store_state(*state_);
        ++offloaded_batches_;
    }

    // Head on the requested rows only, kHeadChunk rows at a time.
    enter(placement_.head);
    if (time_runs_ && backend(cur).host_memory()) {
        // The layers' share of this (synchronous) backend's run so far; the head
        // is timed on its own.
        end_run();
        kind = T <= 8 ? "decode head " : "prompt head ";
    }
    Backend& be = backend(cur);
    PerBackend& p = pb_[size_t(cur)];
    const Tensor x = first_rows(p.s.x, T);
    if (logits) logits->resize(size_t(n_out * V));
    if (ids) ids->resize(size_t(n_out));
    if (top) {
        out.logits->resize(size_t(n_out * top));
        out.ids->resize(size_t(n_out * top));
    }
    // The head's result of rows [r0, r0 + n) to the caller.
    auto read_out = [&](int64_t r0, int64_t n) {
        if (logits) {
            be.read(p.logits, logits->data() + r0 * V, size_t(n * V) * 4);
        } else if (ids) {
            be.read(p.picks, ids->data() + r0, size_t(n) * 4);
        } else {
            be.read(p.top_logits, out.logits->data() + r0 * top, size_t(n * top) * 4);
            be.read(p.top_ids, out.ids->data() + r0 * top, size_t(n * top) * 4);
        }
    };
    for (int64_t r0 = 0; r0 < n_out; r0 += kHeadChunk) {
        const int64_t n = std::min<int64_t>(kHeadChunk, n_out - r0);
        const Tensor xo = first_rows(p.xo, n), lg = first_rows(p.logits, n);
        if (issue) {
            be.get_rows(x, view(p.rows, {n}, {}, size_t(r0) * 4), xo);
            be.rms_norm(xo, output_norm_, hp_.rms_eps, xo);
            if (dumper_) dumper_->write(-1, "result_norm", xo);
            be.matmul(output_, xo, lg, &output_b_);
            if (picks) be.argmax(lg, view(p.picks, {n}, {}));
            if (top) be.top_k(lg, view(p.top_logits, {top, n}, {}), view(p.top_ids, {top, n}, {}));
        }
        if (!graphs && !out.submit) read_out(r0, n);
    }
    if (graphs) {
        be.end_graph();
        if (n_out > 0 && !out.submit) read_out(0, n_out);
    }
    if (out.submit) {
        Submitted sub;
        sub.ticket = be.read_async(p.picks, size_t(n_out) * 4);
        sub.ids.resize(size_t(n_out));
        submitted_.push_back(std::move(sub));
        chainable_rows_ = n_out;
    }
    abort_guard.armed = false;
    if (time_runs_) {
        end_run();
        ++timed_steps_[T <= 8 ? 0 : 1];
    }
    for (const StepInfo::Segment& sg : segs) state_->set_length(sg.slot, sg.pos0 + sg.count);
}

void TransformerModel::submit_argmax(const Batch& batch, bool chain) {
    HeadOut out{nullptr, nullptr, 0};
    out.submit = true;
    out.chain = chain;
    step(batch, out);
}

void TransformerModel::take_ids(Submitted& s) {
    if (s.have_ids) return;
    s.have_ids = true;  // a failed wait is not retried
    backend(placement_.head).finish_read(s.ticket, s.ids.data());
}

void TransformerModel::collect_argmax(std::vector<int32_t>& ids) {
    if (submitted_.empty()) fail("model: collect_argmax without a submitted step");
    Submitted s = std::move(submitted_.front());
    submitted_.pop_front();
    take_ids(s);
    if (submitted_.empty()) last_picks_ = s.ids;
    ids = std::move(s.ids);
}

std::string TransformerModel::backend_description() const {
    std::string out;
    const size_t nb = placement_.backends.size();
    for (size_t bi = 0; bi < nb; ++bi) {
        int first = -1, last = -1, n = 0;
        for (int il = 0; il < int(hp_.n_layer); ++il)
            if (placement_.layer[size_t(il)] == int(bi)) {
                if (first < 0) first = il;
                last = il;
                ++n;
            }
        if (n == 0) continue;
        if (!out.empty()) out += ", ";
        out += placement_.backends[bi]->name();
        if (nb > 1) out += strfmt(" layers %d-%d", first, last);
    }
    if (offload_)
        out += strfmt(", prompts of %d+ tokens on %s%s", opt_.op_offload_min_batch, offload_->target().name().c_str(),
                      offload_->pinned() ? " (pinned)" : "");
    return out;
}

}  // namespace

void Model::submit_argmax(const Batch& batch, bool chain) {
    if (int(ran_.size()) >= kMaxSubmitted)
        fail(strfmt("model: %d steps submitted and not collected (at most %d)", int(ran_.size()), kMaxSubmitted));
    std::vector<int32_t> ids;
    if (chain) {
        const std::vector<int32_t>& prev = ran_.empty() ? last_submitted_ : ran_.back();
        if (prev.size() != batch.size()) fail("model: a chained step needs one pick per token from the step before");
        Batch b = batch;
        b.tokens = prev;
        forward_argmax(b, ids);
    } else {
        forward_argmax(batch, ids);
    }
    last_submitted_ = ids;
    ran_.push_back(std::move(ids));
}

void Model::collect_argmax(std::vector<int32_t>& ids) {
    if (ran_.empty()) fail("model: collect_argmax without a submitted step");
    ids = std::move(ran_.front());
    ran_.pop_front();
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& requested, Placement placement) {
    ModelOptions opt = requested;
    if (opt.n_batch == kBatchAuto) opt.n_batch = kBatchDefault;  // an explicit placement: the plain default
    return std::make_unique<TransformerModel>(gguf::File::open(path), opt, std::move(placement));
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& requested) {
    ModelOptions opt = requested;
    const bool auto_batch = opt.n_batch == kBatchAuto;
    if (auto_batch) opt.n_batch = kBatchDefault;
    auto file = gguf::File::open(path);
    const HParams hp = HParams::from_gguf(*file);
    const int n_threads = opt.n_threads > 0 ? opt.n_threads : physical_cores();
    const int64_t L = hp.n_layer;
    Placement pl;
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(n_threads)));
    pl.layer.assign(size_t(L), 0);
    int64_t ngl = 0;
    const bool have_gpu = (opt.gpu_layers != 0 || opt.op_offload_min_batch > 0) && cuda_device_count() > 0;
    if (opt.gpu_layers != 0 && have_gpu) {
        ngl = opt.gpu_layers > 0 ? std::min<int64_t>(opt.gpu_layers, L + 1) : 0;
        // The planner against what the device has free once the CUDA context
        // exists (and no more than --vram-limit): layers for -ngl auto, and
        // whether the whole model still fits with the larger prompt batch.
        uint64_t free_b = 0, total_b = 0;
        if (opt.gpu_layers == kGpuLayersAuto || auto_batch) {
            if (!cuda_memory_info(0, &free_b, &total_b)) free_b = 0;
            if (opt.vram_limit > 0) free_b = std::min(free_b, opt.vram_limit);
        }
        const auto layers_that_fit = [&](int n_batch) {
            return auto_gpu_layers(*file, hp, opt.n_ctx, opt.n_slots, n_batch, opt.kv_type, free_b,
                                   opt.op_offload_min_batch > 0);
        };
        if (opt.gpu_layers == kGpuLayersAuto) {
            ngl = layers_that_fit(opt.n_batch);
            std::fprintf(stderr, "gpu layers: auto chose %lld of %lld (%.2f GiB free%s)\n", (long long)ngl,
                         (long long)L + 1, double(free_b) / double(1ull << 30), opt.vram_limit ? ", --vram-limit" : "");
        }
        if (auto_batch && ngl > L && layers_that_fit(kBatchFullGpu) > L) opt.n_batch = kBatchFullGpu;
        if (ngl > 0) {
            // -ngl N: the last N layers on the GPU (as llama.cpp); N > n_layer
            // also puts the embedding and the head there, so nothing but token
            // ids and logits crosses the bus.
            pl.backends.push_back(make_cuda_backend(0, opt.vram_limit));
            for (int64_t il = L - std::min(ngl, L); il < L; ++il) pl.layer[size_t(il)] = 1;
            if (ngl > L) pl.embed = pl.head = 1;
        }
    } else if (opt.gpu_layers > 0) {
        std::fprintf(stderr, "warning: no usable GPU; running all %lld layers on the CPU\n", (long long)L);
    }
    if (have_gpu && opt.op_offload_min_batch > 0 && ngl < L) {
        // Layers in host memory: big batches run them on the GPU too. Only for
        // that, a GPU that cannot be set up is not an error.
        try {
            if (pl.backends.size() == 1) pl.backends.push_back(make_cuda_backend(0, opt.vram_limit));
            pl.offload = 1;
        } catch (const Error& e) {
            std::fprintf(stderr, "warning: prompt offload off: %s\n", e.what());
        }
    }
    if (pl.backends.size() == 1) return std::make_unique<TransformerModel>(std::move(file), opt, std::move(pl));
    try {
        return std::make_unique<TransformerModel>(std::move(file), opt, std::move(pl));
    } catch (const Error& e) {
        // Everything allocated so far is gone with the half-built model; say
        // what was tried and what to change.
        const std::string msg = e.what();
        if (msg.find("out of memory") == std::string::npos) throw;
        fail(strfmt("%s; tried -ngl %lld of %lld at context %d x %d slot(s): lower -c, lower -ngl, or use "
                    "--gpu-layers auto%s%s",
                    msg.c_str(), (long long)ngl, (long long)L + 1, opt.n_ctx, opt.n_slots,
                    opt.kv_type == GgmlType::F32 ? ", or an f16 KV cache" : "",
                    opt.n_batch > kBatchDefault ? strfmt(", or -b %d", kBatchDefault).c_str() : ""));
    }
}

}  // namespace qinfer
