// The scheduler thread: owns the Model and runs continuous batching.
//
// HTTP handler threads turn a request into a Job (prompt ids + generation
// settings) and submit() it; the scheduler admits queued jobs into free slots
// between steps (restoring the longest cached prefix first), runs one forward
// per step over every active sequence (one decode token each, then prompt
// chunks), and streams each sequence's text back through the job's Channel.
// Finished and cancelled sequences leave the batch at the end of the step
// that finished them, so a client that disconnects frees its slot within one
// step.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "engine/batch_step.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "qinfer/engine.h"
#include "server/metrics.h"
#include "server/prompt_cache.h"

namespace qinfer::server {

// What the scheduler tells a handler about its job, in order: any number of
// Token events, then exactly one Done or Error.
struct Event {
    enum class Kind { Token, Done, Error } kind = Kind::Token;
    int32_t id = -1;
    std::string piece;       // Token: text released by this token (may be empty)
    GenerateResult result;   // Done
    std::string error;       // Error: one-line message
    int status = 500;        // Error: HTTP status
};

// Single-consumer queue between the scheduler and one handler thread.
class Channel {
public:
    void push(Event e);
    // Waits up to `timeout`; false when nothing arrived.
    bool pop(Event& out, std::chrono::milliseconds timeout);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> q_;
};

struct Job {
    GenerateRequest req;            // sampling, max_tokens, stop strings (prompt fields unused)
    std::vector<int32_t> prompt;    // ids
    std::atomic<bool> cancelled{false};  // set by the handler (client gone); checked every step
    Channel events;
    std::chrono::steady_clock::time_point t_received = std::chrono::steady_clock::now();
};

struct SchedulerOptions {
    int queue_size = 64;             // jobs waiting for a slot; more are refused
    uint64_t cache_bytes = 4ull << 30;  // prompt-cache budget (host memory)
    int checkpoint_interval = 4096;  // also checkpoint every this many prompt tokens (0 = off)
    int parallel_sample_rows = 8;    // batches sampling at least this many rows use several threads
};

class Scheduler {
public:
    Scheduler(Engine& engine, const SchedulerOptions& opt, Metrics& metrics);
    ~Scheduler();  // cancels everything and joins
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a job. False when the queue is full or the scheduler is stopping.
    bool submit(std::shared_ptr<Job> job);

    // Stops admitting new jobs; running and queued jobs finish within
    // `grace`, after that they are cancelled. Returns when the thread ended.
    void shutdown(std::chrono::milliseconds grace);

    int n_slots() const { return n_slots_; }
    int n_ctx() const { return n_ctx_; }

private:
    struct Slot {
        std::vector<int32_t> tokens;  // what the model's slot state holds
        std::unique_ptr<Sequence> seq;
        std::shared_ptr<Job> job;
        std::vector<int> checkpoints;  // prompt positions still to snapshot (ascending)
        // The newest snapshot of a prefix of `tokens` (restored or taken): the
        // next checkpoint of this history stores only the rows added since.
        std::weak_ptr<const StateStore::Snapshot> last_snap;
        uint64_t last_used = 0;
        std::chrono::steady_clock::time_point t_last_token;
    };

    void loop();
    void admit(std::shared_ptr<Job> job);
    int pick_slot(const std::vector<int32_t>& prompt, int& reuse) const;
    bool step();
    void retire(Slot& s);
    void fail_slot(Slot& s, const std::string& msg);
    void update_gauges();

    Engine& engine_;
    Model& model_;
    SchedulerOptions opt_;
    Metrics& metrics_;
    int n_slots_ = 0, n_ctx_ = 0, n_vocab_ = 0;
    int32_t im_start_ = -1;  // <|im_start|>: message boundaries (checkpoint positions)
    uint64_t kv_bytes_per_token_ = 0, recurrent_bytes_per_seq_ = 0;
    bool recurrent_ = false;

    std::vector<Slot> slots_;          // scheduler thread only
    PromptCache cache_;                // scheduler thread only
    uint64_t use_clock_ = 0;
    Batch batch_;
    RowOutputs out_;                 // the forward pass's result for the rows that want a token
    std::vector<Sequence*> want_seqs_;
    std::unique_ptr<ThreadPool> sample_pool_;  // -np >= 8 only

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stopping_ = false;
    bool finished_ = false;
    int free_slots_ = 0;  // as of the last admission round
    std::atomic<bool> cancel_all_{false};
    std::thread thread_;
};

}  // namespace qinfer::server
