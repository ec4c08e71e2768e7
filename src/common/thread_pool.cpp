#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QINFER_PAUSE() _mm_pause()
#else
#define QINFER_PAUSE() std::this_thread::yield()
#endif

namespace qinfer {

namespace {
// Spin for about 100 us before sleeping: longer than the serial gaps between
// the regions of one decode step, far shorter than a scheduler time slice, and
// short enough not to eat much of a busy machine's time. Measured in time, not
// in pause instructions, whose cost ranges from a few to ~140 cycles by CPU.
constexpr int64_t kSpinNs = 100000;
// When threads outnumber cores, a spinning thread may be the one keeping the
// thread it waits for off its core: give the core up almost at once.
constexpr int64_t kSpinNsOversubscribed = 2000;

// Spins while cond() holds, for at most `ns` nanoseconds; returns cond().
template <class Cond>
bool spin_while(Cond&& cond, int64_t ns) {
    using Clock = std::chrono::steady_clock;
    const auto until = Clock::now() + std::chrono::nanoseconds(ns);
    for (;;) {
        for (int i = 0; i < 32; ++i) {
            if (!cond()) return false;
            QINFER_PAUSE();
        }
        if (Clock::now() >= until) return cond();
    }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)), ranges_(std::make_unique<Range[]>(size_t(n_threads_))) {
    const unsigned hw = std::thread::hardware_concurrency();
    spin_ns_ = hw != 0 && unsigned(n_threads_) > hw ? kSpinNsOversubscribed : kSpinNs;
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run_tasks(int id) {
    // Own range first, then the others' leftovers (neighbours first).
    for (int k = 0; k < n_threads_; ++k) {
        Range& r = ranges_[size_t((id + k) % n_threads_)];
        while (r.next.load(std::memory_order_relaxed) < r.end) {
            const int64_t i = r.next.fetch_add(1, std::memory_order_relaxed);
            if (i >= r.end) break;
            (*task_fn_)(i, id);
        }
    }
}

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        spin_while([&] { return generation_.load(std::memory_order_acquire) == seen; }, spin_ns_);
        uint64_t g = generation_.load(std::memory_order_acquire);
        if (g == seen) {
            // Announce the sleep before re-checking (start_region reads sleepers_
            // after bumping the generation), so a wake-up cannot be missed.
            std::unique_lock<std::mutex> lk(mu_);
            sleepers_.fetch_add(1);
            work_cv_.wait(lk, [&] { return generation_.load() != seen; });
            sleepers_.fetch_sub(1);
            g = generation_.load(std::memory_order_acquire);
        }
        seen = g;
        if (stop_) return;
        // Enter region g unless it has been closed (or superseded) meanwhile.
        uint64_t s = region_.load(std::memory_order_acquire);
        bool entered = false;
        while ((s & ~kInside) == gen_bits(g))  // this generation, not closed
            if (region_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
                entered = true;
                break;
            }
        if (!entered) continue;
        run_tasks(id);
        const uint64_t before = region_.fetch_sub(1);  // seq_cst: ordered before the caller_sleeping_ check
        if ((before & kInside) == 1 && caller_sleeping_.load()) {
            std::lock_guard<std::mutex> lk(mu_);
            done_cv_.notify_one();
        }
    }
}

void ThreadPool::start_region() {
    const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;
    region_.store(gen_bits(g), std::memory_order_release);  // open, nobody inside
    generation_.store(g);  // seq_cst: ordered before the sleepers_ check below
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lk(mu_);
        work_cv_.notify_all();
    }
}

void ThreadPool::close_region() {
    // All tasks are taken once the caller's run_tasks returns: close the region
    // to latecomers and wait only for the workers still running a task.
    region_.fetch_or(kClosed);
    if (!spin_while([&] { return (region_.load(std::memory_order_acquire) & kInside) != 0; }, spin_ns_)) return;
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_.store(true);
    done_cv_.wait(lk, [&] { return (region_.load() & kInside) == 0; });
    caller_sleeping_.store(false);
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
        return;
    }
    task_fn_ = &fn;
    for (int t = 0; t < n_threads_; ++t) {
        ranges_[size_t(t)].next.store(n_tasks * t / n_threads_, std::memory_order_relaxed);
        ranges_[size_t(t)].end = n_tasks * (t + 1) / n_threads_;
    }
    start_region();
    run_tasks(0);
    close_region();
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
    const int n = n_threads_;
    parallel_for(n, [&](int64_t part, int) { fn(int(part), n); });
}

}  // namespace qinfer
