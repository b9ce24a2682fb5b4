// AVX2 dequantization of the block formats (quant.h): the same exact values
// as the portable code, 8 lanes at a time.
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include "quant.h"

namespace ck {
namespace avx2 {
namespace {

// 8 signed bytes at p as f32.
CK_AVX2 inline __m256 i8x8(const __m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

CK_AVX2 void q8_0(const uint8_t* b, float* out) {
  const __m256 d = _mm256_set1_ps(half_at(b));
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
  _mm256_storeu_ps(out, _mm256_mul_ps(d, i8x8(lo)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(d, i8x8(_mm_srli_si128(lo, 8))));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(d, i8x8(hi)));
  _mm256_storeu_ps(out + 24, _mm256_mul_ps(d, i8x8(_mm_srli_si128(hi, 8))));
}

CK_AVX2 void q4_0(const uint8_t* b, float* out) {
  const __m256 d = _mm256_set1_ps(half_at(b));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i m = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m), eight);
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m), eight);
  _mm256_storeu_ps(out, _mm256_mul_ps(d, i8x8(lo)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(d, i8x8(_mm_srli_si128(lo, 8))));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(d, i8x8(hi)));
  _mm256_storeu_ps(out + 24, _mm256_mul_ps(d, i8x8(_mm_srli_si128(hi, 8))));
}

// 32 unsigned 4-bit values (one per byte of v) as d·q − m into out[0, 32).
CK_AVX2 inline void nibbles32(__m256i v, __m256 d, __m256 m, float* out) {
  const __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
  const __m128i parts[4] = {a, _mm_srli_si128(a, 8), b, _mm_srli_si128(b, 8)};
  for (int i = 0; i < 4; ++i) {
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
    _mm256_storeu_ps(out + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d, q), m));
  }
}

CK_AVX2 void q4_k(const uint8_t* b, float* out) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  const __m256i mask = _mm256_set1_epi8(0xF);
  for (int c = 0; c < 4; ++c, q += 32, out += 64) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    int sc, m;
    q4k_scale_min(2 * c, scales, &sc, &m);
    nibbles32(_mm256_and_si256(v, mask), _mm256_set1_ps(d * static_cast<float>(sc)),
              _mm256_set1_ps(dmin * static_cast<float>(m)), out);
    q4k_scale_min(2 * c + 1, scales, &sc, &m);
    nibbles32(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask), _mm256_set1_ps(d * static_cast<float>(sc)),
              _mm256_set1_ps(dmin * static_cast<float>(m)), out + 32);
  }
}

CK_AVX2 void q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, out += 128) {
    for (int l = 0; l < 32; l += 8) {
      const int is = l / 16;
      const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l)));
      const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l + 32)));
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + l)));
      const __m256i hb[4] = {_mm256_and_si256(e, m2), _mm256_and_si256(_mm256_srli_epi32(e, 2), m2),
                             _mm256_and_si256(_mm256_srli_epi32(e, 4), m2), _mm256_and_si256(_mm256_srli_epi32(e, 6), m2)};
      const __m256i lb[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(c, m4), _mm256_srli_epi32(a, 4),
                             _mm256_srli_epi32(c, 4)};
      for (int i = 0; i < 4; ++i) {
        const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lb[i], _mm256_slli_epi32(hb[i], 4)), off);
        const __m256 s = _mm256_set1_ps(d * static_cast<float>(sc[is + 2 * i]));
        _mm256_storeu_ps(out + l + 32 * i, _mm256_mul_ps(s, _mm256_cvtepi32_ps(q)));
      }
    }
  }
}

}  // namespace

CK_AVX2 void dequantize(DType t, const void* src, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(src);
  const BlockShape b = block_shape(t);
  if (!is_quantized(t)) return ck::dequantize(t, src, n, out);
  for (int64_t i = 0; i < n; i += b.elems, p += b.bytes, out += b.elems) {
    switch (t) {
      case DType::Q8_0: q8_0(p, out); break;
      case DType::Q4_0: q4_0(p, out); break;
      case DType::Q4_K: q4_k(p, out); break;
      case DType::Q6_K: q6_k(p, out); break;
      default: break;
    }
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
