// Persistent worker threads for data-parallel loops on the CPU backend.
//
// Decode issues a few hundred short parallel regions per token, so both the
// workers (waiting for the next region) and the caller (waiting for the region
// to finish) spin briefly before they sleep: waking a sleeping thread costs more
// than most regions. The spin is short, and shorter still when the pool has more
// threads than the machine has cores, where a spinning thread only takes time
// from the one it waits for.
//
// parallel_for gives every thread a contiguous range of the task indices and
// lets a thread that finishes early take tasks from the others' ranges: with
// tasks that are consecutive weight rows, each thread streams one contiguous
// slice of memory, and a descheduled thread does not stall the region.
//
// The join waits only for workers that are running a task. A worker that has
// not joined the region by the time the caller has taken the last task (it was
// asleep, or the OS had not scheduled it) finds the region closed and skips it,
// so on a busy machine a region costs what its work costs, not a scheduler
// time slice per late thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace qinfer {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads >= 1 (the caller's thread counts as one)
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(i, thread_id) for every i in [0, n_tasks), spread over the threads;
    // returns when all calls have finished. Thread t starts on tasks
    // [n*t/size, n*(t+1)/size) in order, then helps with the others' leftovers,
    // so which thread runs a task varies: results must not depend on it.
    // Not reentrant: fn must not call parallel_for on the same pool.
    void parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn);

    // Calls fn(part, n_parts) once for every part in [0, n_parts = size()):
    // static partitioning. Part t runs on thread t unless that thread is late,
    // in which case another thread runs it.
    void run_on_all(const std::function<void(int, int)>& fn);

    // Parallel regions run so far (the fork/join count; for tests and profiles).
    uint64_t regions() const { return generation_.load(std::memory_order_relaxed); }

private:
    struct alignas(64) Range {
        std::atomic<int64_t> next{0};
        int64_t end = 0;
    };

    void worker(int id);
    void run_tasks(int id);
    void start_region();  // publishes the region and wakes sleeping workers
    void close_region();  // the caller's join: close, then wait for the workers inside

    // Region word: generation (bits 33-63), closed flag (bit 32), workers inside (bits 0-31).
    static constexpr uint64_t kClosed = uint64_t(1) << 32, kInside = kClosed - 1;
    static uint64_t gen_bits(uint64_t g) { return g << 33; }

    int n_threads_;
    int64_t spin_ns_;  // how long a waiting thread spins before it sleeps
    std::vector<std::thread> threads_;
    std::unique_ptr<Range[]> ranges_;

    std::mutex mu_;
    std::condition_variable work_cv_;  // workers sleep here between regions
    std::condition_variable done_cv_;  // the caller sleeps here until a region ends
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> caller_sleeping_{false};
    std::atomic<uint64_t> region_{0};
    const std::function<void(int64_t, int)>* task_fn_ = nullptr;
    std::atomic<bool> stop_{false};
};

}  // namespace qinfer
