#include "common/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QINFER_PAUSE() _mm_pause()
#else
#define QINFER_PAUSE() std::this_thread::yield()
#endif

namespace qinfer {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run_tasks(int id) {
    if (all_fn_) {
        (*all_fn_)(id, n_threads_);
        return;
    }
    for (;;) {
        int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
        if (i >= n_tasks_) break;
        (*task_fn_)(i, id);
    }
}

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        // Spin a little, then sleep until the next region starts.
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen && spins < 20000) {
            QINFER_PAUSE();
            ++spins;
        }
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_) return;
        run_tasks(id);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
        return;
    }
    task_fn_ = &fn;
    all_fn_ = nullptr;
    n_tasks_ = n_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lk(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_tasks(0);
    while (pending_.load(std::memory_order_acquire) != 0) QINFER_PAUSE();
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    all_fn_ = &fn;
    task_fn_ = nullptr;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lk(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_tasks(0);
    while (pending_.load(std::memory_order_acquire) != 0) QINFER_PAUSE();
    all_fn_ = nullptr;
}

}  // namespace qinfer
