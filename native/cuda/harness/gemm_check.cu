// The batch-invariant GEMM (native/cuda/gemm.cu) in the harness: against the
// CPU kernel and float64, a row's bits alone against the same row inside
// batches that run either tiling (with and without a workspace), and timings
// beside cuBLAS and the device copy bandwidth.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../kernels_cuda.cuh"
#include "harness.cuh"

namespace ck::harness {
namespace {

// x as the tensor cores see it: rounded to W's 16-bit type (nearest even).
float round_to(float v, ck::DType wt) {
  if (wt == ck::DType::F32) return v;
  if (wt == ck::DType::F16) return ck::f16_to_f32(ck::f32_to_f16(v));
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;  // finite inputs only (randn)
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// y = x W^T + bias in float64, with x optionally rounded to W's type first.
std::vector<float> reference(const std::vector<float>& x, const Weights& W, const std::vector<float>& bias, int32_t T,
                             int32_t K, int32_t N, bool rounded) {
  std::vector<float> y(static_cast<size_t>(T) * N);
  std::vector<double> w(static_cast<size_t>(K));
  for (int32_t n = 0; n < N; ++n) {
    for (int32_t k = 0; k < K; ++k) {
      const size_t wi = static_cast<size_t>(n) * K + k;
      w[static_cast<size_t>(k)] = W.wt == ck::DType::F32   ? W.f32[wi]
                                  : W.wt == ck::DType::F16 ? ck::f16_to_f32(W.half[wi])
                                                           : ck::bf16_to_f32(W.half[wi]);
    }
    for (int32_t t = 0; t < T; ++t) {
      double s = bias[static_cast<size_t>(n)];
      for (int32_t k = 0; k < K; ++k) {
        const float xv = x[static_cast<size_t>(t) * K + k];
        s += static_cast<double>(rounded ? round_to(xv, W.wt) : xv) * w[static_cast<size_t>(k)];
      }
      y[static_cast<size_t>(t) * N + n] = static_cast<float>(s);
    }
  }
  return y;
}

}  // namespace

void check_matmul(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, ck::DType wt) {
  // K % 16 == 8: the last 16-k step is half zeros; 4 pieces of 256; N not a multiple of 64.
  const int32_t T = 77, K = 1000, N = 300;
  const std::string tag = std::string(dtype_name(wt));
  Weights W(rng, static_cast<size_t>(N) * K, wt, 0.05f);
  const std::vector<float> x = randn(rng, static_cast<size_t>(T) * K), bias = randn(rng, N);
  std::vector<float> cpu(static_cast<size_t>(T) * N, NAN);
  ck::matmul(x.data(), T, K, W.host(), wt, N, bias.data(), cpu.data(), pool);
  const std::vector<float> f64 = reference(x, W, bias, T, K, N, false);
  DevBuf<float> dx(x), db(bias), dy(cpu.size());
  ck::cuda::GemmWorkspace ws;
  dy.poison();
  ck::cuda::matmul(dx.get(), T, K, W.dev, wt, N, db.get(), dy.get(), nullptr, &ws);
  const std::vector<float> gpu = dy.download();
  const Diff vs_cpu = compare(gpu, cpu), vs_f64 = compare(gpu, f64);
  if (wt == ck::DType::F32) {
    tally.check(vs_cpu.non_finite == 0 && vs_cpu.rel_l2 < 1e-5, "matmul vs CPU " + tag, vs_cpu.str());
    tally.check(vs_f64.non_finite == 0 && vs_f64.rel_l2 < 1e-5, "matmul vs f64 " + tag, vs_f64.str());
  } else {
    // The sums against float64 of the operands the tensor cores multiply;
    // then the whole against the unrounded x (the rounding of x: 2^-11 / 2^-8).
    const Diff vs_ops = compare(gpu, reference(x, W, bias, T, K, N, true));
    const double tol = wt == ck::DType::F16 ? 2e-3 : 1.5e-2;
    tally.check(vs_ops.non_finite == 0 && vs_ops.rel_l2 < 1e-5, "matmul vs f64 of its operands " + tag,
                vs_ops.str());
    tally.check(vs_f64.non_finite == 0 && vs_f64.rel_l2 < tol, "matmul vs f64 " + tag + " (x rounded)",
                vs_f64.str());
    tally.check(vs_cpu.non_finite == 0 && vs_cpu.rel_l2 < tol, "matmul vs CPU " + tag + " (x rounded)",
                vs_cpu.str());
  }

  // Batch invariance: row 0 alone, then at a random index of batches of
  // 2..16 and larger, through the decode tiling (with a workspace, T <= 64)
  // and the prefill tiling (T > 64, or no workspace).
  DevBuf<float> y1(static_cast<size_t>(N));
  DevBuf<float> x1(std::vector<float>(x.begin(), x.begin() + K));
  ck::cuda::matmul(x1.get(), 1, K, W.dev, wt, N, db.get(), y1.get(), nullptr, &ws);
  const std::vector<float> alone = y1.download();
  struct Case {
    int32_t B;
    bool ws;
  };
  std::vector<Case> cases;
  for (int32_t B = 2; B <= 16; ++B) cases.push_back({B, true});
  for (int32_t B : {24, 40, 64, 65, 200}) cases.push_back({B, true});
  for (int32_t B : {1, 16, 200}) cases.push_back({B, false});
  int32_t differing = 0;
  std::string which;
  for (const Case& c : cases) {
    std::vector<float> xb = randn(rng, static_cast<size_t>(c.B) * K);
    const int32_t at = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.B));
    std::copy(x.begin(), x.begin() + K, xb.begin() + static_cast<std::ptrdiff_t>(at) * K);
    DevBuf<float> dxb(xb), dyb(static_cast<size_t>(c.B) * N);
    dyb.poison();
    ck::cuda::matmul(dxb.get(), c.B, K, W.dev, wt, N, db.get(), dyb.get(), nullptr, c.ws ? &ws : nullptr);
    const std::vector<float> yb = dyb.download();
    if (!same_bits(alone.data(), &yb[static_cast<size_t>(at) * N], static_cast<size_t>(N))) {
      ++differing;
      which += " " + std::to_string(c.B) + (c.ws ? "" : "(no ws)");
    }
  }
  tally.check(differing == 0, "matmul batch invariance " + tag,
              "row alone vs batches 2..16, 24, 40, 64, 65, 200 and 1, 16, 200 without a workspace: " +
                  std::to_string(differing) + " of " + std::to_string(cases.size()) + " differ" + which);

#if defined(CK_HAVE_CUBLAS)
  ck::cuda::CublasGemm gemm(nullptr, int64_t{256} * K);
  dy.poison();
  gemm.matmul(dx.get(), T, K, W.dev, wt, N, db.get(), dy.get());
  const std::vector<float> cb = dy.download();
  const Diff cb_f64 = compare(cb, f64);
  // f16/bf16 weights: x is rounded to the weight type first (2^-11 / 2^-8).
  const double tol = wt == ck::DType::F32 ? 1e-5 : wt == ck::DType::F16 ? 2e-3 : 1.5e-2;
  tally.check(cb_f64.non_finite == 0 && cb_f64.rel_l2 < tol, "cuBLAS GemmEx vs f64 " + tag, cb_f64.str());
#endif
}

GemmTimes time_gemm(std::mt19937_64& rng, bool quick, int reps) {
  GemmTimes out;
  const int32_t K = 4096, N = 4096, Tp = quick ? 1024 : 4096;
  const double flops = 2.0 * Tp * K * N, weight_bytes = 2.0 * K * N;
  DevBuf<float> x(randn(rng, static_cast<size_t>(Tp) * K)), y(static_cast<size_t>(Tp) * N);
  ck::cuda::GemmWorkspace ws;
  const std::string shape = "T=" + std::to_string(Tp) + " K=N=4096";
  for (ck::DType wt : {ck::DType::F16, ck::DType::BF16}) {
    Weights W(rng, static_cast<size_t>(N) * K, wt, 0.02f);
    const double ms =
        time_ms([&] { ck::cuda::matmul(x.get(), Tp, K, W.dev, wt, N, nullptr, y.get(), nullptr, &ws); }, 2, reps);
    (wt == ck::DType::F16 ? out.tflops_f16 : out.tflops_bf16) = flops / (ms * 1e9);
    std::printf("%-52s %9.3f ms %9.1f TFLOP/s\n", ("GEMM (mma) " + shape + " " + dtype_name(wt) + " W").c_str(), ms,
                flops / (ms * 1e9));
    if (wt != ck::DType::F16) continue;
    const int32_t decode_t[3] = {1, 8, 32};
    for (int i = 0; i < 3; ++i) {
      const int32_t Td = decode_t[i];
      const double dms =
          time_ms([&] { ck::cuda::matmul(x.get(), Td, K, W.dev, wt, N, nullptr, y.get(), nullptr, &ws); }, 2, reps);
      out.decode_gbs[i] = weight_bytes / (dms * 1e6);
      std::printf("%-52s %9.3f ms %9.1f GB/s (weights)\n",
                  ("GEMM (mma) T=" + std::to_string(Td) + " (decode) K=N=4096 f16 W").c_str(), dms, out.decode_gbs[i]);
    }
    const double fms =
        time_ms([&] { ck::cuda::matmul_fma(x.get(), 8, K, W.dev, wt, N, nullptr, y.get(), nullptr); }, 2, reps);
    std::printf("%-52s %9.3f ms %9.1f GB/s (weights)\n", "FMA-chain matmul T=8 K=N=4096 f16 W (the old path)", fms,
                weight_bytes / (fms * 1e6));
#if defined(CK_HAVE_CUBLAS)
    ck::cuda::CublasGemm gemm(nullptr, int64_t{Tp} * K);
    const double cms = time_ms([&] { gemm.matmul(x.get(), Tp, K, W.dev, wt, N, nullptr, y.get()); }, 2, reps);
    out.cublas_tflops = flops / (cms * 1e9);
    std::printf("%-52s %9.3f ms %9.1f TFLOP/s\n", ("cuBLAS GemmEx " + shape + " f16 (x->f16 incl.)").c_str(), cms,
                out.cublas_tflops);
    for (const int32_t Td : {1, 8, 32}) {
      const double cdms = time_ms([&] { gemm.matmul(x.get(), Td, K, W.dev, wt, N, nullptr, y.get()); }, 2, reps);
      std::printf("%-52s %9.3f ms %9.1f GB/s (weights)\n",
                  ("cuBLAS GemmEx T=" + std::to_string(Td) + " K=N=4096 f16").c_str(), cdms,
                  weight_bytes / (cdms * 1e6));
    }
#endif
  }
  return out;
}

}  // namespace ck::harness
