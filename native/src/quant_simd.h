// Eight consecutive elements of a block-quantized weight row as f32, in
// registers (quant.h's formats and exact values): the quantized loads of the
// AVX2 GEMM tiles (kernels_avx2.cc), so a decode-sized product streams the
// blocks and never writes the dequantized weights to memory. Include only
// from AVX2-attributed code.
#pragma once

#include "quant.h"
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <cstring>

namespace ck {
namespace avx2 {

// The f16 at p broadcast to 8 lanes as f32 (exact).
CK_AVX2 inline __m256 half8(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
}

// 8 bytes at p.
CK_AVX2 inline __m128i bytes8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }

// Elements [i, i + 8) of W (i a multiple of 8; W's rows whole blocks, so i
// counts from the matrix start).
template <DType WT>
CK_AVX2 inline __m256 quant_load8(const void* W, int64_t i) {
  const auto* base = static_cast<const uint8_t*>(W);
  if constexpr (WT == DType::Q8_0) {
    const uint8_t* b = base + (i >> 5) * 34;
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8(b + 2 + (i & 31))));
    return _mm256_mul_ps(half8(b), q);
  } else if constexpr (WT == DType::Q4_0) {
    const uint8_t* b = base + (i >> 5) * 18;
    const int o = static_cast<int>(i & 31);
    __m128i v = bytes8(b + 2 + (o & 15));
    if (o >= 16) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(0xF));
    const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), _mm256_set1_epi32(8));
    return _mm256_mul_ps(half8(b), _mm256_cvtepi32_ps(q));
  } else if constexpr (WT == DType::Q4_K) {
    const uint8_t* b = base + (i >> 8) * 144;
    const int e = static_cast<int>(i & 255), chunk = e >> 6, hi = (e >> 5) & 1, l = e & 31;
    const int g = 2 * chunk + hi;
    int sc, m;
    q4k_scale_min(g, b + 4, &sc, &m);
    __m128i v = bytes8(b + 16 + 32 * chunk + l);
    if (hi) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(0xF));
    const __m256 d1 = _mm256_mul_ps(half8(b), _mm256_set1_ps(static_cast<float>(sc)));
    const __m256 m1 = _mm256_mul_ps(half8(b + 2), _mm256_set1_ps(static_cast<float>(m)));
    return _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))), m1);
  } else {  // Q6_K
    const uint8_t* b = base + (i >> 8) * 210;
    const int e = static_cast<int>(i & 255), h = e >> 7, quarter = (e >> 5) & 3, l = e & 31;
    __m128i lo = bytes8(b + 64 * h + l + (quarter & 1) * 32);
    if (quarter >= 2) lo = _mm_srli_epi16(lo, 4);
    lo = _mm_and_si128(lo, _mm_set1_epi8(0xF));
    const __m128i hb = _mm_and_si128(_mm_srl_epi16(bytes8(b + 128 + 32 * h + l), _mm_cvtsi32_si128(2 * quarter)),
                                     _mm_set1_epi8(3));
    const __m128i q8 = _mm_or_si128(lo, _mm_slli_epi16(hb, 4));
    const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q8), _mm256_set1_epi32(32));
    const int sc = static_cast<int8_t>(b[192 + 8 * h + l / 16 + 2 * quarter]);
    const __m256 ds = _mm256_mul_ps(half8(b + 208), _mm256_set1_ps(static_cast<float>(sc)));
    return _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q));
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
