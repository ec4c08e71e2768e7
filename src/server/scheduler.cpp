#include "server/scheduler.h"

#include <algorithm>

#include "common/error.h"
#include "engine/batch_step.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::server {

using Clock = std::chrono::steady_clock;

namespace {
// A message boundary this close to the end of a prompt replaces the
// end-of-prompt checkpoint (see admit()).
constexpr int kEndCheckpointGap = 64;

int common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    return int(i);
}

uint64_t micros_between(Clock::time_point a, Clock::time_point b) {
    return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count());
}
uint64_t micros_since(Clock::time_point t0) { return micros_between(t0, Clock::now()); }

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}
}  // namespace

void Channel::push(Event e) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        q_.push_back(std::move(e));
    }
    cv_.notify_one();
}

bool Channel::pop(Event& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
}

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt, Metrics& metrics)
    : engine_(engine), model_(engine.model()), opt_(opt), metrics_(metrics), cache_(opt.cache_bytes) {
    n_slots_ = model_.options().n_slots;
    n_ctx_ = model_.options().n_ctx;
    n_vocab_ = int(model_.hparams().n_vocab);
    slots_.resize(size_t(n_slots_));
    free_slots_ = n_slots_;
    const std::vector<int32_t> im = engine_.tokenize("<|im_start|>", true);
    if (im.size() == 1) im_start_ = im[0];
    const StateSizes sz = state_sizes(model_.hparams(), model_.options().kv_type);
    kv_bytes_per_token_ = sz.kv_bytes_per_token;
    recurrent_bytes_per_seq_ = sz.recurrent_bytes_per_seq;
    metrics_.n_slots = n_slots_;
    metrics_.state_bytes_allocated =
        uint64_t(n_slots_) * (uint64_t(n_ctx_) * kv_bytes_per_token_ + recurrent_bytes_per_seq_);
    const int hw = int(std::thread::hardware_concurrency());
    if (n_slots_ >= opt_.parallel_sample_rows && hw > 1) sample_pool_ = std::make_unique<ThreadPool>(std::min(hw, 8));
    thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

bool Scheduler::submit(std::shared_ptr<Job> job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        // Jobs about to fill a free slot are not waiting: they do not count against the queue.
        if (stopping_ || int(queue_.size()) >= opt_.queue_size + free_slots_) return false;
        queue_.push_back(std::move(job));
        metrics_.queue_depth = int64_t(queue_.size());
    }
    cv_.notify_all();
    return true;
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
    {
        std::unique_lock<std::mutex> lock(mu_);
        stopping_ = true;
        cv_.notify_all();
        cv_.wait_for(lock, grace, [&] { return finished_; });
        cancel_all_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

// The free slot whose history is the longest prefix of `prompt` (`reuse` =
// its length); among equals the one sharing the longest prefix with the
// prompt at all (a restored checkpoint then keeps those KV rows), then the
// least recently used; -1 when no slot is free.
int Scheduler::pick_slot(const std::vector<int32_t>& prompt, int& reuse) const {
    int best = -1, best_common = 0;
    reuse = 0;
    for (int i = 0; i < n_slots_; i++) {
        const Slot& s = slots_[size_t(i)];
        if (s.seq) continue;
        const bool valid = model_.slot_length(i) == int(s.tokens.size());
        const int common = valid ? common_prefix(s.tokens, prompt) : 0;
        int r = 0;
        if (!s.tokens.empty() && s.tokens.size() < prompt.size() && common == int(s.tokens.size()))
            r = int(s.tokens.size());
        const bool better = best < 0 || r > reuse || (r == reuse && common > best_common) ||
                            (r == reuse && common == best_common && s.last_used < slots_[size_t(best)].last_used);
        if (better) {
            best = i;
            reuse = r;
            best_common = common;
        }
    }
    return best;
}

void Scheduler::admit(std::shared_ptr<Job> job) {
    const auto t_admit = Clock::now();
    metrics_.queue_seconds.observe(seconds_between(job->t_received, t_admit));
    if (job->cancelled) {
        Event e;
        e.kind = Event::Kind::Error;
        e.status = 499;
        e.error = "request cancelled";
        job->events.push(std::move(e));
        return;
    }
    int reuse = 0;
    const int si = pick_slot(job->prompt, reuse);
    if (!job->req.reuse_cache) reuse = 0;
    Slot& s = slots_[size_t(si)];
    s.last_used = ++use_clock_;

    // Longest reusable state: the slot's own history, or a checkpoint.
    int n_cached = reuse;
    std::shared_ptr<const PromptCache::Entry> entry;
    if (job->req.reuse_cache) entry = cache_.find(job->prompt);
    try {
        if (entry && int(entry->tokens.size()) > reuse) {
            // KV rows the slot holds for the same tokens stay: only the rest
            // of the checkpoint (and its DeltaNet state) is copied in.
            const int keep = model_.slot_length(si) == int(s.tokens.size()) ? common_prefix(s.tokens, entry->tokens) : 0;
            const auto t0 = Clock::now();
            model_.restore_slot(si, *entry->state, keep);
            metrics_.snapshot_us += micros_since(t0);
            s.tokens = entry->tokens;
            s.last_snap = entry->state;
            n_cached = int(entry->tokens.size());
        } else if (reuse == 0) {
            model_.clear_slot(si);
            s.tokens.clear();
            s.last_snap.reset();
        }
    } catch (const Error& e) {
        model_.clear_slot(si);
        s.tokens.clear();
        s.last_snap.reset();
        n_cached = 0;
    }
    (n_cached > 0 ? metrics_.cache_hits : metrics_.cache_misses)++;

    Slot* sp = &s;
    Job* jp = job.get();
    GenerateCallbacks cb;
    cb.on_token = [this, sp, jp](int32_t id, std::string_view piece) {
        const auto now = Clock::now();
        if (sp->seq && sp->seq->result().n_generated == 1)
            metrics_.ttft_seconds.observe(seconds_between(jp->t_received, now));
        else
            metrics_.token_seconds.observe(seconds_between(sp->t_last_token, now));
        sp->t_last_token = now;
        metrics_.generated_tokens++;
        Event e;
        e.kind = Event::Kind::Token;
        e.id = id;
        e.piece = std::string(piece);
        jp->events.push(std::move(e));
        return !jp->cancelled.load();
    };
    auto seq = std::make_unique<Sequence>(engine_.tokenizer(), n_vocab_, n_ctx_, si, job->req, std::move(cb));
    try {
        seq->set_prompt(job->prompt, n_cached);
    } catch (const Error& e) {
        Event ev;
        ev.kind = Event::Kind::Error;
        ev.status = 400;
        ev.error = e.what();
        job->events.push(std::move(ev));
        return;
    }
    n_cached = seq->n_past();
    metrics_.prompt_tokens += job->prompt.size();
    metrics_.prompt_tokens_cached += uint64_t(n_cached);

    // Where to snapshot this prompt: before its last message (the next turn
    // of a conversation shares everything up to there), every K tokens, and
    // at its end.
    const int n = int(job->prompt.size());
    std::vector<int> cps;
    int boundary = -1;
    if (im_start_ >= 0) {
        for (int i = n - 1; i > n_cached; i--) {
            if (job->prompt[size_t(i)] == im_start_) {
                boundary = i;
                break;
            }
        }
    }
    if (boundary >= 0) cps.push_back(boundary);
    if (opt_.checkpoint_interval > 0)
        for (int p = (n_cached / opt_.checkpoint_interval + 1) * opt_.checkpoint_interval; p < n;
             p += opt_.checkpoint_interval)
            cps.push_back(p);
    // The end of the prompt only when no message boundary lies just before it:
    // a chat prompt ends in "<|im_start|>assistant\n" (plus any thinking
    // prefix) that the next turn renders differently, so a snapshot there is
    // rarely a prefix of anything, and with a long history it would evict the
    // boundary snapshot from the budget. Repeating the prompt exactly still
    // reuses the boundary one (a few tokens to recompute).
    if (boundary < 0 || n - boundary > kEndCheckpointGap) cps.push_back(n);
    std::sort(cps.begin(), cps.end());
    cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
    if (opt_.cache_bytes == 0) cps.clear();

    s.checkpoints = std::move(cps);
    s.seq = std::move(seq);
    s.job = std::move(job);
    s.t_last_token = Clock::now();
}

bool Scheduler::step() {
    const int budget = model_.options().n_batch;
    batch_.clear();
    std::vector<Slot*> touched, want;
    auto take = [&](Slot& s) {
        const int room = budget - int(batch_.size());
        if (room <= 0 || !s.seq || s.seq->done()) return;
        int cap = room;
        // A prompt chunk stops at the next checkpoint so the snapshot is taken there.
        if (s.seq->prefilling() && !s.checkpoints.empty())
            cap = std::min(cap, std::max(1, s.checkpoints.front() - s.seq->n_past()));
        const size_t before = batch_.size();
        if (s.seq->add_to_batch(batch_, cap) == 0) return;
        s.tokens.insert(s.tokens.end(), batch_.tokens.begin() + std::ptrdiff_t(before), batch_.tokens.end());
        touched.push_back(&s);
        if (s.seq->wants_logits()) want.push_back(&s);
    };
    for (Slot& s : slots_)
        if (s.seq && !s.seq->prefilling()) take(s);
    for (Slot& s : slots_)
        if (s.seq && s.seq->prefilling()) take(s);
    if (batch_.size() == 0) return false;

    uint64_t n_prompt_tokens = 0;
    for (size_t i = 0; i < batch_.size(); i++) {
        const Slot& s = slots_[size_t(batch_.slot[i])];
        if (batch_.pos[i] < int(s.seq->prompt().size())) n_prompt_tokens++;
    }
    // The backend sends back no more per row than the samplers need: one id
    // when all are greedy, a few candidates when all sample from a top-k set.
    want_seqs_.clear();
    for (const Slot* s : want) want_seqs_.push_back(s->seq.get());
    const auto t_forward = Clock::now();
    try {
        forward_rows(model_, batch_, want_seqs_, out_);
    } catch (const std::exception& e) {
        for (Slot* s : touched) fail_slot(*s, std::string("model error: ") + e.what());
        return true;
    }
    const auto t_sample = Clock::now();
    metrics_.forward_us += micros_between(t_forward, t_sample);
    metrics_.forward_steps++;
    metrics_.offloaded_steps = model_.offloaded_batches();
    if (out_.kind == RowOutputs::Ids) metrics_.argmax_steps++;
    if (out_.kind == RowOutputs::Candidates) metrics_.candidate_steps++;
    metrics_.batch_tokens += batch_.size();
    metrics_.prompt_tokens_processed += n_prompt_tokens;
    // Sampling and detokenizing are per sequence (each touches only its own
    // Sequence, Slot and Job; metrics are atomic): a big batch spreads them
    // over the sampling threads. 64 greedy rows over a 248k vocabulary are
    // ~6 ms on one core, as much as the forward pass they follow.
    auto sample = [&](size_t i) {
        out_.deliver(i, *want[i]->seq, n_vocab_);
    };
    if (out_.kind == RowOutputs::Logits && sample_pool_ && want.size() >= size_t(std::max(1, opt_.parallel_sample_rows))) {
        std::vector<std::string> errors(want.size());
        sample_pool_->run_on_all([&](int id, int nt) {
            for (size_t i = size_t(id); i < want.size(); i += size_t(nt)) {
                try {
                    sample(i);
                } catch (const std::exception& e) {
                    errors[i] = e.what();
                }
            }
        });
        for (size_t i = 0; i < want.size(); i++)
            if (!errors[i].empty()) fail_slot(*want[i], "sampling error: " + errors[i]);
    } else {
        for (size_t i = 0; i < want.size(); i++) sample(i);
    }
    metrics_.sample_us += micros_since(t_sample);

    for (Slot* s : touched) {
        const int at = int(s->tokens.size());
        while (!s->checkpoints.empty() && s->checkpoints.front() <= at) {
            // On top of this history's newest snapshot still in the cache: only
            // the rows added since are copied. A snapshot larger than the whole
            // budget would be dropped: do not copy it.
            std::shared_ptr<const StateStore::Snapshot> base = s->last_snap.lock();
            if (base && (base->length > at || !cache_.holds(base.get()))) base.reset();
            const int from = base ? base->length : 0;
            const uint64_t est = uint64_t(at - from) * kv_bytes_per_token_ + recurrent_bytes_per_seq_;
            if (s->checkpoints.front() == at && est <= opt_.cache_bytes && !cache_.contains(s->tokens)) {
                try {
                    const auto t0 = Clock::now();
                    std::shared_ptr<const StateStore::Snapshot> snap = model_.save_slot(int(s - slots_.data()), base);
                    cache_.add(s->tokens, snap);
                    s->last_snap = snap;
                    metrics_.snapshot_us += micros_since(t0);
                } catch (const std::exception&) {
                    // Out of host memory for a snapshot: serve on without it.
                }
            }
            s->checkpoints.erase(s->checkpoints.begin());
        }
    }
    return true;
}

void Scheduler::fail_slot(Slot& s, const std::string& msg) {
    const int si = int(&s - slots_.data());
    model_.clear_slot(si);
    s.tokens.clear();
    s.last_snap.reset();
    const std::shared_ptr<Job> job = std::move(s.job);
    s.seq.reset();
    s.checkpoints.clear();
    update_gauges();  // as retire(): before the client sees the error
    if (job) {
        Event e;
        e.kind = Event::Kind::Error;
        e.status = 500;
        e.error = msg;
        job->events.push(std::move(e));
    }
}

void Scheduler::retire(Slot& s) {
    Event e;
    e.kind = Event::Kind::Done;
    e.result = s.seq->result();
    const std::shared_ptr<Job> job = std::move(s.job);
    s.seq.reset();
    s.checkpoints.clear();
    s.last_used = ++use_clock_;
    // The gauges count the sequence as finished before its client can see that
    // it is (a /metrics read after the last event never shows it active).
    update_gauges();
    job->events.push(std::move(e));
}

void Scheduler::update_gauges() {
    int64_t active = 0;
    uint64_t in_use = 0;
    for (const Slot& s : slots_) {
        if (s.seq) active++;
        if (!s.tokens.empty()) in_use += uint64_t(s.tokens.size()) * kv_bytes_per_token_ + recurrent_bytes_per_seq_;
    }
    metrics_.active_sequences = active;
    metrics_.state_bytes_in_use = in_use;
    metrics_.cache_bytes = cache_.bytes();
    metrics_.cache_entries = cache_.size();
}

void Scheduler::loop() {
    for (;;) {
        std::vector<std::shared_ptr<Job>> admitted;
        int n_free = 0;
        for (const Slot& s : slots_) n_free += s.seq ? 0 : 1;
        const bool any_active = n_free < n_slots_;
        {
            std::unique_lock<std::mutex> lock(mu_);
            free_slots_ = n_free;
            if (!any_active) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (cancel_all_) {
                for (auto& job : queue_) {
                    Event e;
                    e.kind = Event::Kind::Error;
                    e.status = 503;
                    e.error = "the server is shutting down";
                    job->events.push(std::move(e));
                }
                queue_.clear();
            }
            if (stopping_ && queue_.empty() && !any_active) {
                finished_ = true;
                metrics_.queue_depth = 0;
                cv_.notify_all();
                break;
            }
            while (!queue_.empty() && int(admitted.size()) < n_free) {
                admitted.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
            free_slots_ = n_free - int(admitted.size());
            metrics_.queue_depth = int64_t(queue_.size());
        }
        for (auto& job : admitted) admit(std::move(job));

        // Cancelled sequences leave before the step, finished ones after it.
        const bool cancel_all = cancel_all_;
        for (Slot& s : slots_) {
            if (s.seq && (cancel_all || s.job->cancelled)) s.seq->cancel();
            if (s.seq && s.seq->done()) retire(s);
        }
        step();
        for (Slot& s : slots_)
            if (s.seq && s.seq->done()) retire(s);
        update_gauges();
    }
    update_gauges();
}

}  // namespace qinfer::server
