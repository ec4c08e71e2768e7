// Persistent worker threads for data-parallel loops on the CPU backend.
// Decode issues hundreds of short parallel regions per token, so workers spin
// briefly before sleeping: waking a sleeping thread costs more than the work.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
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
    // returns when all calls have finished. Tasks are handed out dynamically.
    // Not reentrant: fn must not call parallel_for on the same pool.
    void parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn);

    // Calls fn(thread_id, n_threads) once on every thread (static partitioning).
    void run_on_all(const std::function<void(int, int)>& fn);

private:
    void worker(int id);
    void run_tasks(int id);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<int64_t> next_task_{0};
    int64_t n_tasks_ = 0;
    const std::function<void(int64_t, int)>* task_fn_ = nullptr;
    const std::function<void(int, int)>* all_fn_ = nullptr;
    std::atomic<bool> stop_{false};
};

}  // namespace qinfer
