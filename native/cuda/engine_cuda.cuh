// The CUDA engine: the Backend of native/src/backend.h on one device. Weights
// stay resident in device memory in their load dtype; per-layer fp16 K/V page
// pools and the contiguous oracle cache live in device memory; step() runs the
// full forward with the kernels of kernels_cuda.cuh on a compute stream (batch
// arrays host -> device, logits device -> host); page download/upload/copy
// run on PageTransfer's copy stream through its pinned staging slabs.
//
// Validation is the shared code of backend.cc, so both backends refuse the
// same batches with the same messages. Every CUDA call is checked (check.cuh):
// a failure throws CudaError (a std::runtime_error) with file:line, call and
// the driver's reason, which the binding turns into a rejected promise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../src/backend.h"
#include "kernels_cuda.cuh"
#include "profile.cuh"

namespace ck::cuda {

// Device memory of `bytes`, freed on destruction; checked allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  void reserve(size_t bytes);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceWeight {
  DType dtype = DType::F32;
  DeviceBuffer data;
};

struct DeviceLayer {
  DeviceWeight input_norm, q, k, v, o, mlp_norm, gate, up, down;
  DeviceWeight q_norm, k_norm;               // qk_norm only
  DeviceWeight attn_out_norm, mlp_out_norm;  // sandwich_norms only
  DeviceBuffer q_bias, k_bias, v_bias;  // f32 (unallocated without attention bias)
};

// Pinned staging for transfers: kTransferSlabs slabs of up to kTransferSlabTarget bytes each.
constexpr int32_t kTransferSlabs = 2;
constexpr size_t kTransferSlabTarget = size_t{64} << 20;

class CudaEngine final : public Backend {
 public:
  // Throws when the spec is outside what the CUDA kernels support, or no device is usable.
  CudaEngine(const ModelSpec& spec, std::vector<float> inv_freq);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  // Empty when the CUDA kernels support the spec, else why not.
  static std::string unsupported(const ModelSpec& spec);

  const char* name() const override { return "cuda"; }
  const ModelSpec& spec() const override { return spec_; }
  int32_t threads() const override { return 1; }

  std::string set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) override;
  int64_t num_pages() const override { return num_pages_; }
  int32_t page_size() const override { return page_size_; }
  bool has_contiguous() const override { return ctx_seqs_ > 0; }

  std::string validate_paged(const StepBatch& b) const override;
  std::string validate_contiguous(const StepBatch& b) const override;
  void step(const StepBatch& b, float* logits) override;
  void step_contiguous(const StepBatch& b, float* logits) override;

  std::string validate_pages(const std::vector<int32_t>& ids) const override;
  void download_pages(const std::vector<int32_t>& ids, uint8_t* out) override;
  void upload_pages(const std::vector<int32_t>& ids, const uint8_t* in) override;
  void copy_page(int32_t src, int32_t dst) override;

  std::string set_profiling(bool on) override {
    profiler_.enable(on);
    return "";
  }
  StepProfile profile() const override { return profiler_.totals(); }

 protected:
  std::string allocate_pool(int64_t num_pages, int32_t page_size) override;
  std::string allocate_contiguous(int32_t num_seqs, int32_t ctx_cap) override;

 private:
  enum class Mode { Paged, Contiguous };
  void forward(const StepBatch& b, Mode mode, float* logits);
  // y = x · w^T (+ bias) on the compute stream, with this engine's GEMM workspace, timed when profiling.
  void gemm(const float* x, int32_t T, int32_t K, const DeviceWeight& w, int32_t N, const float* bias, float* y);
  // Scratch for a batch of T rows reading at most max_keys keys (grow-only).
  void reserve_scratch(int32_t T, int32_t R, int32_t max_keys);
  template <typename T>
  void upload(DeviceBuffer& dst, const std::vector<T>& src);
  // Runs `begin` (returns a ticket or -1 when no slab is free) for successive
  // chunks of `ids` that fit one slab, then waits for all.
  template <typename Begin>
  void transfer_chunks(const std::vector<int32_t>& ids, Begin begin);

  ModelSpec spec_;
  int device_ = 0;
  cudaStream_t compute_ = nullptr;
  DeviceBuffer inv_freq_;  // [n_layers, head_dim / 2] f32
  DeviceWeight embed_, final_norm_, lm_head_;
  std::vector<DeviceLayer> layers_;

  int64_t num_pages_ = 0;
  int32_t page_size_ = 0;
  std::vector<DeviceBuffer> k_pages_, v_pages_;  // per layer
  std::unique_ptr<PageTransfer> transfer_;

  int32_t ctx_seqs_ = 0, ctx_cap_ = 0;
  std::vector<DeviceBuffer> k_ctx_, v_ctx_;  // per layer

  // Per-step device scratch.
  DeviceBuffer tokens_, positions_, row_seq_, slots_, page_table_;
  DeviceBuffer x_, h_, o_, q_, k_, v_, attn_, g_, u_, sel_, nsel_, logits_, workspace_;
  GemmWorkspace gemm_ws_;
  StepProfiler profiler_;
};

}  // namespace ck::cuda
