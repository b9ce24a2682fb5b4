// Target-attributed x86 helpers shared by the AVX2 / AVX-512 kernel files
// (kernels_avx2.cc, attention_simd.cc). Each function carries its target
// attribute instead of a file being compiled with -mavx2, so no vector code
// can leak into the baseline paths; include this only from files whose code
// runs after cpu_features() has confirmed the ISA.
#pragma once

#include "cpu.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#define CK_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CK_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq")))
// AVX512-VNNI's dot products on 256-bit registers (needs AVX512-VL).
#define CK_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

namespace ck {
namespace simd {

// The one horizontal sum of every 8-lane reduction (GEMM and attention):
// lanes (0+4, 1+5, 2+6, 3+7), then (0+4+2+6, 1+5+3+7), then their sum.
// Changing it changes the bits of every path that must equal another.
CK_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// c + a · b rounded once (the scalar tails of the 8-lane loops).
CK_AVX2 inline float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// 8 f16 values at p as f32 (exact).
CK_AVX2 inline __m256 load_f16x8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace simd
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
