// AVX2 + FMA + F16C elementwise primitives of the dense ops (cpu.h), apart
// from the GEMM tiles; the same target-attribute discipline (simd_x86.h).
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include "cpu.h"

namespace ck {
namespace avx2 {

CK_AVX2 void f32_to_f16_row(const float* x, f16* y, int32_t n) {
  // VCVTPS2PH with round-to-nearest-even: the same bits as ck::f32_to_f16
  // (subnormals kept, overflow to inf, NaN quieted with its payload's top bits).
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  for (int32_t i = n8; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

CK_AVX2 double sum_squares(const float* x, int32_t n) {
  // Lanes 0-3 and 4-7 of the 8 partial sums; x² is exact in f64, so the FMA
  // rounds exactly like the portable square-then-add.
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
  // (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then (s0 + s2) + (s1 + s3).
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  for (int32_t i = n8; i < n; ++i) r += static_cast<double>(x[i]) * x[i];
  return r;
}

// exp(v) as generic::expf_poly computes it, 8 lanes at once (every step an
// IEEE operation of the same operands in the same order).
CK_AVX2 inline __m256 exp8(__m256 v) {
  v = _mm256_min_ps(v, _mm256_set1_ps(kExpHi));
  v = _mm256_max_ps(v, _mm256_set1_ps(kExpLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), v);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

CK_AVX2 void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));  // -g, as the scalar negation
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (int64_t i = n8; i < n; ++i) out[i] = generic::silu(gate[i]) * up[i];
}

// generic::gelu_tanh lane by lane: the same IEEE operations in the same order.
CK_AVX2 void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 cubic = _mm256_set1_ps(kGeluCubic);
  const __m256 k = _mm256_set1_ps(kGeluMinus2Sqrt2OverPi);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_fmadd_ps(cubic, g3, g), k));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (int64_t i = n8; i < n; ++i) out[i] = generic::gelu_tanh(gate[i]) * up[i];
}

CK_AVX2 double exp_sum(const float* x, int32_t n, float m) {
  // Lanes 0-3 and 4-7 of the 8 partial sums, each adding its f32 term
  // widened to f64, as the portable loop does.
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const __m256 mv = _mm256_set1_ps(m);
  const __m256 lim = _mm256_set1_ps(kExpLo);
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(d, lim, _CMP_LT_OQ), exp8(d));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  for (int32_t i = n8; i < n; ++i) {
    const float d = x[i] - m;
    r += d < kExpLo ? 0.0f : generic::expf_poly(d);
  }
  return r;
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
