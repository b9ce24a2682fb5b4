// Device time of an engine's steps by part, from CUDA events, when enabled
// (recording events costs host time, so it is off by default). The engine
// brackets each step, each GEMM and each attention call on its compute
// stream, and collects after the step's synchronisation: the rest of the
// step (norms, RoPE, appends, residual adds, embedding, the logits copy) is
// step − GEMM − attention.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "../src/backend.h"

namespace ck::cuda {

enum class StepPart : int32_t { Gemm = 0, Attention = 1 };

class StepProfiler {
 public:
  StepProfiler() = default;
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Any thread; takes effect at the next begin_step. Enabling clears the totals.
  void enable(bool on);
  // The compute thread, around one step on `stream`. active(): this step records.
  void begin_step(cudaStream_t stream);
  bool active() const { return step_on_; }
  void begin(StepPart part, cudaStream_t stream);
  void end(StepPart part, cudaStream_t stream);
  // After `stream` synchronized: adds the step's intervals to the totals.
  void end_step_synchronized(cudaStream_t stream);
  // Any thread.
  StepProfile totals() const;

 private:
  struct Interval {
    StepPart part;
    cudaEvent_t start, stop;
  };
  cudaEvent_t event();

  std::atomic<bool> enabled_{false};
  bool step_on_ = false;
  cudaEvent_t step_start_ = nullptr;
  std::vector<Interval> open_;   // this step's intervals (the last one may be unfinished)
  std::vector<cudaEvent_t> pool_;  // events for reuse; bounded by the most a step has recorded
  mutable std::mutex mu_;
  StepProfile totals_;
};

}  // namespace ck::cuda
