// What the AVX2 GEMM (kernels_avx2.cc) and its 512-bit row-pair tiles
// (gemm_avx512.cc) share: the weight loads and the row-pair entry point.
#pragma once

#include "quant.h"
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#define CK_AVX512BW __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512bw")))

namespace ck {
namespace avx2 {

CK_AVX2 inline __m256 load_bf16x8(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

template <DType WT>
CK_AVX2 inline __m256 load_w8(const void* W, int64_t i) {
  static_assert(!is_quantized(WT), "block formats: quant_dot.h");
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(W) + i);
  } else if constexpr (WT == DType::F16) {
    return simd::load_f16x8(static_cast<const f16*>(W) + i);
  } else {
    return load_bf16x8(static_cast<const bf16*>(W) + i);
  }
}

template <DType WT>
inline float load_w1(const void* W, int64_t i) {
  if constexpr (WT == DType::F32) {
    return static_cast<const float*>(W)[i];
  } else if constexpr (WT == DType::F16) {
    return f16_to_f32(static_cast<const f16*>(W)[i]);
  } else {
    return bf16_to_f32(static_cast<const bf16*>(W)[i]);
  }
}

template <DType WT>
inline const void* weight_row(const void* W, int64_t row, int32_t K) {
  return static_cast<const uint8_t*>(W) + row * bytes_of(WT, K);
}

// Row pairs per 512-bit tile: blocks of 16 rows.
constexpr int kPairRows = 8;      // row pairs per tile: 16 rows

// Rows [0, T16) (whole 16-row blocks, K >= 8) of columns [n0, n1) on the
// 512-bit row-pair tiles; xp: those rows as pack_rows packed them.
void row_pairs(const float* x, const float* xp, int32_t T16, int32_t K, const void* W, DType wt, int32_t N,
               const float* bias, float* y, int32_t n0, int32_t n1);

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
