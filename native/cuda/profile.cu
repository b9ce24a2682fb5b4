// StepProfiler (profile.cuh).
#include "profile.cuh"

#include "check.cuh"

namespace ck::cuda {

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  for (const Interval& i : open_) cudaEventDestroy(i.start), cudaEventDestroy(i.stop);
  if (step_start_ != nullptr) cudaEventDestroy(step_start_);
}

void StepProfiler::enable(bool on) {
  if (on) {
    const std::lock_guard<std::mutex> lock(mu_);
    totals_ = StepProfile{};
  }
  enabled_.store(on);
}

cudaEvent_t StepProfiler::event() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CK_CUDA(cudaEventCreate(&e));
  return e;
}

void StepProfiler::begin_step(cudaStream_t stream) {
  // Intervals of a step that threw before it was collected are dropped.
  for (const Interval& i : open_) pool_.push_back(i.start), pool_.push_back(i.stop);
  open_.clear();
  step_on_ = enabled_.load();
  if (!step_on_) return;
  if (step_start_ == nullptr) step_start_ = event();
  CK_CUDA(cudaEventRecord(step_start_, stream));
}

void StepProfiler::begin(StepPart part, cudaStream_t stream) {
  if (!step_on_) return;
  Interval i{part, event(), event()};
  CK_CUDA(cudaEventRecord(i.start, stream));
  open_.push_back(i);
}

void StepProfiler::end(StepPart part, cudaStream_t stream) {
  if (!step_on_) return;
  CK_REQUIRE(!open_.empty() && open_.back().part == part, "StepProfiler: end without its begin");
  CK_CUDA(cudaEventRecord(open_.back().stop, stream));
}

void StepProfiler::end_step_synchronized(cudaStream_t stream) {
  if (!step_on_) return;
  cudaEvent_t stop = event();
  CK_CUDA(cudaEventRecord(stop, stream));
  CK_CUDA(cudaEventSynchronize(stop));
  float step_ms = 0, part_ms[2] = {0, 0};
  CK_CUDA(cudaEventElapsedTime(&step_ms, step_start_, stop));
  for (const Interval& i : open_) {
    float ms = 0;
    CK_CUDA(cudaEventElapsedTime(&ms, i.start, i.stop));
    part_ms[static_cast<int32_t>(i.part)] += ms;
    pool_.push_back(i.start);
    pool_.push_back(i.stop);
  }
  pool_.push_back(stop);
  open_.clear();
  step_on_ = false;
  const std::lock_guard<std::mutex> lock(mu_);
  totals_.steps += 1;
  totals_.step_ms += step_ms;
  totals_.gemm_ms += part_ms[0];
  totals_.attention_ms += part_ms[1];
}

StepProfile StepProfiler::totals() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

}  // namespace ck::cuda
