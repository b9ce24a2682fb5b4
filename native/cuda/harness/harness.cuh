// The GPU check harness's shared pieces (gpu_check.cu has main and the
// kernel checks; gemm_check.cu the GEMM's checks and timings; engine_check.cu
// the CUDA engine's). Header-only helpers, inline.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../../src/kernels.h"
#include "../../src/thread_pool.h"
#include "../check.cuh"

namespace ck::harness {

using ck::f16;

// ---- small infrastructure ---------------------------------------------------

template <class T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) { CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    CK_REQUIRE(h.size() == n_, "DevBuf::upload: size mismatch");
    CK_CUDA(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // All-ones bytes: NaN as f32 and as f16, so an unwritten output is caught.
  void poison() { CK_CUDA(cudaMemset(p_, 0xff, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

struct Tally {
  int passed = 0, failed = 0;
  void check(bool ok, const std::string& name, const std::string& detail) {
    std::printf("%s %-44s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
    std::fflush(stdout);
    (ok ? passed : failed)++;
  }
};

struct Diff {
  double max_abs = 0, rel_l2 = 0;  // rel_l2 = ||gpu - ref|| / ||ref||
  int64_t non_finite = 0;          // GPU outputs that are NaN/inf (poison left, or a bug)
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "max_abs=%.3e rel_l2=%.3e non_finite=%lld", max_abs, rel_l2,
                  static_cast<long long>(non_finite));
    return b;
  }
};

inline Diff compare(const std::vector<float>& gpu, const std::vector<float>& ref) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) {
      ++d.non_finite;
      continue;
    }
    const double e = static_cast<double>(gpu[i]) - ref[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

inline bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

inline std::vector<float> randn(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<f16> rand_f16(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::vector<f16> v(n);
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& h : v) h = ck::f32_to_f16(nd(rng));
  return v;
}

inline std::vector<uint16_t> to_weight(const std::vector<float>& w, ck::DType wt) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (wt == ck::DType::F16) {
      out[i] = ck::f32_to_f16(w[i]);
    } else {  // bf16, round to nearest even
      uint32_t u;
      std::memcpy(&u, &w[i], 4);
      out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  return out;
}

inline const char* dtype_name(ck::DType t) { return t == ck::DType::F32 ? "f32" : t == ck::DType::F16 ? "f16" : "bf16"; }

// Weights of any dtype held on host and device.
struct Weights {
  ck::DType wt;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  void* dev = nullptr;
  Weights(std::mt19937_64& rng, size_t n, ck::DType t, float scale) : wt(t), f32(randn(rng, n, scale)) {
    size_t bytes = n * 4;
    const void* src = f32.data();
    if (t != ck::DType::F32) {
      half = to_weight(f32, t);
      bytes = n * 2;
      src = half.data();
    }
    CK_CUDA(cudaMalloc(&dev, bytes));
    CK_CUDA(cudaMemcpy(dev, src, bytes, cudaMemcpyHostToDevice));
  }
  ~Weights() { cudaFree(dev); }
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;
  const void* host() const { return wt == ck::DType::F32 ? static_cast<const void*>(f32.data()) : half.data(); }
};

// Median milliseconds of `reps` timed runs after `warm` untimed ones.
inline double time_ms(const std::function<void()>& fn, int warm, int reps) {
  for (int i = 0; i < warm; ++i) fn();
  CK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK_CUDA(cudaEventCreate(&a));
  CK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    CK_CUDA(cudaEventRecord(a));
    fn();
    CK_CUDA(cudaEventRecord(b));
    CK_CUDA(cudaEventSynchronize(b));
    CK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], a, b));
  }
  CK_CUDA(cudaEventDestroy(a));
  CK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}


// ---- the parts in other files ------------------------------------------------------
// gemm_check.cu
void check_matmul(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, ck::DType wt);
struct GemmTimes {
  double tflops_f16 = 0, tflops_bf16 = 0, cublas_tflops = 0;  // T = 4096 (1024 quick), K = N = 4096
  double decode_gbs[3] = {0, 0, 0};                            // T = 1, 8, 32: weight bytes / time
};
GemmTimes time_gemm(std::mt19937_64& rng, bool quick, int reps);
// engine_check.cu
void check_engine(Tally& tally, std::mt19937_64& rng);
void check_engine_invariance(Tally& tally, std::mt19937_64& rng);
// transfer_check.cu
void check_transfers(Tally& tally, std::mt19937_64& rng);

}  // namespace ck::harness
