// AVX2 integer path of quant_dot.h: the activation quantizer and the
// register tiles of the Q8_0/Q4_0 products (maddubs + madd lane sums, exact,
// then quant_dot.h's f32 FMA per block and lane: the portable bits). The
// AVX-512 ISA runs these tiles too, with vpdpbusd for the lane sums where the
// CPU has AVX512-VNNI (the same bits; quant_dot_tiles.inc says why).
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quant.h"
#include "quant_dot.h"

namespace ck {
namespace avx2 {
namespace {

#define CK_QT CK_AVX2
#define CK_QDOT(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#include "quant_dot_tiles.inc"
#undef CK_QDOT
#undef CK_QT

}  // namespace

CK_AVX2 void quantize_rows(const float* x, int32_t T, int32_t K, int8_t* q, float* d, int32_t* s8) {
  const int64_t blocks = static_cast<int64_t>(T) * (K / 32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * 32;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float amax = _mm_cvtss_f32(h);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    const __m256 iv = _mm256_set1_ps(id);
    // cvtps rounds half to even (MXCSR's default), as nearbyint does; the
    // packs saturate to [-128, 127] as the portable clamp.
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv));
    const __m256i p = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), p);
    const __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s8 + b * 8), _mm256_slli_epi32(l, 3));
  }
}

CK_AVX2 void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                                 int32_t n0, int32_t n1) {
  by_type(x, W, wt, N, bias, y, n0, n1);
}

}  // namespace avx2

// The same tiles with AVX512-VNNI's vpdpbusd on 256-bit registers (one
// instruction where AVX2 takes maddubs and madd); the activation quantizer
// is AVX2's.
namespace avx512vnni {
namespace {

#define CK_QT CK_AVX2_VNNI
#define CK_QDOT(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#include "quant_dot_tiles.inc"
#undef CK_QDOT
#undef CK_QT

}  // namespace

CK_AVX2_VNNI void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias,
                                      float* y, int32_t n0, int32_t n1) {
  by_type(x, W, wt, N, bias, y, n0, n1);
}

}  // namespace avx512vnni
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
