#include "fma_peak.h"

#include "simd_x86.h"

namespace ck {
namespace {

// Independent chains per thread: more than latency × FMA ports (4 × 2) on
// current x86 cores, so the loop is throughput-bound.
constexpr int kFmaChains = 12;

// x <- x·m + a stays near 1 for m just below 1; the result feeds a sink so
// the loop is not optimised away.
float chains_generic(int64_t iters) {
  float acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = 1.0f + 0.01f * static_cast<float>(i);
  for (int64_t n = 0; n < iters; ++n)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = __builtin_fmaf(acc[i], 0.999999f, 1e-6f);
  float s = 0.0f;
  for (float a : acc) s += a;
  return s;
}

#ifdef CK_HAVE_AVX2_PATH
CK_AVX2 float chains_avx2(int64_t iters) {
  __m256 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
  for (int64_t n = 0; n < iters; ++n)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  __m256 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm256_add_ps(s, acc[i]);
  return simd::hsum(s);
}

CK_AVX512 float chains_avx512(int64_t iters) {
  __m512 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
  for (int64_t n = 0; n < iters; ++n)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  __m512 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}
#endif

volatile float g_sink;

}  // namespace

double fma_peak_flops(int64_t iters, ThreadPool* pool) {
  const int64_t threads = pool != nullptr ? pool->threads() : 1;
  int lanes = 1;
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() == Isa::Avx512) lanes = 16;
  else if (active_isa() == Isa::Avx2) lanes = 8;
#endif
  parallel_for(pool, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
#ifdef CK_HAVE_AVX2_PATH
      if (lanes == 16) {
        g_sink = chains_avx512(iters);
        continue;
      }
      if (lanes == 8) {
        g_sink = chains_avx2(iters);
        continue;
      }
#endif
      g_sink = chains_generic(iters);
    }
  });
  return static_cast<double>(threads) * static_cast<double>(iters) * kFmaChains * lanes * 2.0;
}

}  // namespace ck
