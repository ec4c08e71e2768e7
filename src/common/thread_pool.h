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

    // Calls fn(thread_id, n_threads) once on every thread (static partitioning).
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
    void wait_region();   // the caller's wait for the workers

    int n_threads_;
    int spin_limit_;  // pause iterations before a waiting thread sleeps
    std::vector<std::thread> threads_;
    std::unique_ptr<Range[]> ranges_;

    std::mutex mu_;
    std::condition_variable work_cv_;  // workers sleep here between regions
    std::condition_variable done_cv_;  // the caller sleeps here until a region ends
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> caller_sleeping_{false};
    std::atomic<int> pending_{0};
    const std::function<void(int64_t, int)>* task_fn_ = nullptr;
    const std::function<void(int, int)>* all_fn_ = nullptr;
    std::atomic<bool> stop_{false};
};

}  // namespace qinfer
