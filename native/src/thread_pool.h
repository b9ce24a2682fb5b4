// A fixed pool of worker threads for the CPU kernels. It partitions OUTPUTS
// only: parallel_for hands out disjoint index ranges [begin, end) of output
// items, and every item is computed entirely by one thread, so results never
// depend on the thread count or on which thread took which range (the
// determinism contract in kernels.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ck {

class ThreadPool {
 public:
  // threads >= 1 counts the caller: threads - 1 workers are started.
  // background: workers run at a lower scheduling priority (see
  // lower_thread_priority) so they never starve the JavaScript thread.
  explicit ThreadPool(int32_t threads, bool background = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) in chunks of `grain` items, on the workers
  // and the calling thread, and returns when every item is done. One caller
  // at a time (the engine's compute thread, or the kernel test hook).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  // Workers inside the current job. A worker joins (under mu_) only while
  // the job is open; the caller closes it once every chunk is claimed, so it
  // never waits for a worker that was not yet running then.
  std::atomic<int32_t> active_{0};
  bool open_ = false;
  std::atomic<uint64_t> generation_{0};  // bumps once per parallel_for, wakes workers
  std::atomic<bool> stop_{false};
};

// Lowers the calling thread's priority (Linux: nice +5 for this thread only;
// elsewhere a no-op). Compute threads use it so the event loop, heartbeats and
// HTTP keep answering while a long prefill holds every core.
void lower_thread_priority();

// Runs over the pool when there is one, else inline on the caller.
void parallel_for(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ck
