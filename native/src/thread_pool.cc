#include "thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ck {

void lower_thread_priority() {
#if defined(__linux__)
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  setpriority(PRIO_PROCESS, tid, getpriority(PRIO_PROCESS, tid) + 5);
#endif
}

ThreadPool::ThreadPool(int32_t threads, bool background) {
  const int32_t n = std::max<int32_t>(1, threads);
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int32_t i = 0; i + 1 < n; ++i)
    workers_.emplace_back([this, background] {
      if (background) lower_thread_priority();
      worker_loop();
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {

// Spins until done() for at most kSpin, then returns done(). A decode step
// issues ~60 parallel_fors back to back, each tens of microseconds long, and
// a futex sleep and wake costs about as much as one of them.
constexpr auto kSpin = std::chrono::microseconds(100);

template <class Done>
bool spin_until(Done done) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}

}  // namespace

void ThreadPool::run_chunks() {
  for (;;) {
    const int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (b >= n_) return;
    (*fn_)(b, std::min(n_, b + grain_));
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, ready);
    }
    if (stop_.load()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      seen = generation_.load(std::memory_order_relaxed);
      if (!open_) continue;  // the caller claimed every chunk already
      active_.fetch_add(1, std::memory_order_relaxed);
    }
    run_chunks();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    open_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks();
  {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = false;
  }
  auto idle = [&] { return active_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(idle)) {
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, idle);
  }
  fn_ = nullptr;
}

void parallel_for(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool != nullptr) {
    pool->parallel_for(n, grain, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

}  // namespace ck
