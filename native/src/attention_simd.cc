// AVX2 and AVX-512 inner loops of CPU attention; the contract, and the bits
// each element gets, are in attention_simd.h.
//
// Register budgets. Scores: G heads × J keys 8-lane accumulators, so that
// at least 8 independent FMA chains cover the FMA latency (4 cycles, 2
// ports) — one key at a time left only G = 4 chains. Values: G heads × C
// lane blocks accumulators stay in registers for a whole run of keys, so
// each value element costs one FMA, not a load, an FMA and a store.
#include "attention_simd.h"
#include "simd_x86.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace ck {
namespace {

using simd::fma1;
using simd::hsum;
using simd::load_f16x8;

// The scalar tail of a score: t = hsum(acc), then t = fma(q_i, k_i, t) for
// i = d8 .. d - 1, then scale · t.
CK_AVX2 inline float finish_score(float t, const float* q, const f16* k, int32_t d8, int32_t d, float scale) {
  for (int32_t i = d8; i < d; ++i) t = fma1(q[i], f16_to_f32(k[i]), t);
  return scale * t;
}

// ---- scores -------------------------------------------------------------

// G heads × J consecutive keys.
template <int G, int J>
CK_AVX2 void scores_block(const float* q, int64_t q_stride, const f16* const* k, int64_t k_off, int32_t d, float scale,
                          float* s, int64_t s_stride) {
  __m256 acc[G][J];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < J; ++j) acc[g][j] = _mm256_setzero_ps();
  const int32_t d8 = d & ~7;
  for (int32_t i = 0; i < d8; i += 8) {
    __m256 kv[J];
    for (int j = 0; j < J; ++j) kv[j] = load_f16x8(k[j] + k_off + i);
    for (int g = 0; g < G; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * q_stride + i);
      for (int j = 0; j < J; ++j) acc[g][j] = _mm256_fmadd_ps(qv, kv[j], acc[g][j]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < J; ++j)
      s[g * s_stride + j] = finish_score(hsum(acc[g][j]), q + g * q_stride, k[j] + k_off, d8, d, scale);
}

// All n keys for G heads: blocks of J keys, then single keys.
template <int G, int J>
CK_AVX2 void scores_heads(const float* q, int64_t q_stride, const f16* const* k, int64_t k_off, int32_t n, int32_t d,
                          float scale, float* s, int64_t s_stride) {
  int32_t j = 0;
  for (; j + J <= n; j += J) scores_block<G, J>(q, q_stride, k + j, k_off, d, scale, s + j, s_stride);
  for (; j < n; ++j) scores_block<G, 1>(q, q_stride, k + j, k_off, d, scale, s + j, s_stride);
}

// ---- softmax ------------------------------------------------------------

// e^x for x <= 0 (or NaN), lane by lane; see attention_simd.h.
CK_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, ln2 = 0.693359375 - 2.12194440e-4 (the first part has 9
  // significant bits, so n · it is exact for |n| <= 2^15).
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // e^r = 1 + r + r^2 P(r)
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  // 2^n for n in [-126, 0] (x >= ln(FLT_MIN)); below that the lane is 0.
  // NaN compares "not less" and keeps its NaN through p.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365447505531f), _CMP_NLT_UQ);
  return _mm256_and_ps(y, keep);
}

// Lanes [0, n) of p, n < 8, read without touching memory past them.
CK_AVX2 inline __m256 load_partial(const float* p, int32_t n) {
  float b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(b, p, static_cast<size_t>(n) * sizeof(float));
  return _mm256_loadu_ps(b);
}

// ---- values ---------------------------------------------------------------

// Lanes [i0, i0 + 8C) of G heads' outputs over n keys, accumulators in
// registers for the whole run.
template <int G, int C>
CK_AVX2 void values_block(const float* p, int64_t p_stride, const f16* const* v, int64_t v_off, int32_t n, float* o,
                          int64_t o_stride) {
  __m256 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm256_loadu_ps(o + g * o_stride + 8 * c);
  for (int32_t j = 0; j < n; ++j) {
    __m256 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load_f16x8(v[j] + v_off + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 pb = _mm256_broadcast_ss(p + g * p_stride + j);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm256_fmadd_ps(pb, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + g * o_stride + 8 * c, acc[g][c]);
}

// Lanes i >= d & ~7 one at a time, keys in order.
template <int G>
CK_AVX2 void values_tail(const float* p, int64_t p_stride, const f16* const* v, int64_t v_off, int32_t n, int32_t d8,
                         int32_t d, float* o, int64_t o_stride) {
  for (int g = 0; g < G; ++g)
    for (int32_t i = d8; i < d; ++i) {
      float a = o[g * o_stride + i];
      for (int32_t j = 0; j < n; ++j) a = fma1(p[g * p_stride + j], f16_to_f32(v[j][v_off + i]), a);
      o[g * o_stride + i] = a;
    }
}

// G heads, all d lanes: blocks of 8C lanes, then of 8, then the tail.
template <int G, int C>
CK_AVX2 void values_heads(const float* p, int64_t p_stride, const f16* const* v, int64_t v_off, int32_t n, int32_t d,
                          float* o, int64_t o_stride) {
  int32_t i = 0;
  for (; i + 8 * C <= d; i += 8 * C) values_block<G, C>(p, p_stride, v, v_off + i, n, o + i, o_stride);
  for (; i + 8 <= d; i += 8) values_block<G, 1>(p, p_stride, v, v_off + i, n, o + i, o_stride);
  values_tail<G>(p, p_stride, v, v_off, n, i, d, o, o_stride);
}

}  // namespace

namespace avx2 {

// Keys per block by heads per call: G · J >= 8 chains where the 16 ymm
// registers allow (accumulators + J keys + one q).
CK_AVX2 void attention_scores(const float* q, int64_t q_stride, int32_t G, const f16* const* k, int64_t k_off,
                              int32_t n, int32_t d, float scale, float* s, int64_t s_stride) {
  int32_t g = 0;
  for (; g + 4 <= G; g += 4)
    scores_heads<4, 2>(q + g * q_stride, q_stride, k, k_off, n, d, scale, s + g * s_stride, s_stride);
  const float* qg = q + g * q_stride;
  float* sg = s + g * s_stride;
  switch (G - g) {
    case 3: return scores_heads<3, 3>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    case 2: return scores_heads<2, 4>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    case 1: return scores_heads<1, 6>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    default: return;
  }
}

CK_AVX2 float softmax_numerators(float* s, int32_t L) {
  const int32_t L8 = L & ~7;
  float m = s[0];
  if (L8 > 0) {
    __m256 mv = _mm256_loadu_ps(s);
    for (int32_t j = 8; j < L8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int i = 0; i < 8; ++i) m = std::max(m, lanes[i]);
  }
  for (int32_t j = L8; j < L; ++j) m = std::max(m, s[j]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (int32_t j = 0; j < L8; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, p);
    acc = _mm256_add_ps(acc, p);
  }
  float l = hsum(acc);
  if (L8 < L) {
    float p[8];
    _mm256_storeu_ps(p, exp8(_mm256_sub_ps(load_partial(s + L8, L - L8), mv)));
    for (int32_t j = L8; j < L; ++j) {
      s[j] = p[j - L8];
      l += s[j];
    }
  }
  return l;
}

// Heads per call by lane blocks: G · C accumulators + C value vectors + one
// broadcast p within the 16 ymm registers.
CK_AVX2 void attention_values(const float* p, int64_t p_stride, int32_t G, const f16* const* v, int64_t v_off,
                              int32_t n, int32_t d, float* o, int64_t o_stride) {
  int32_t g = 0;
  for (; g + 4 <= G; g += 4)
    values_heads<4, 2>(p + g * p_stride, p_stride, v, v_off, n, d, o + g * o_stride, o_stride);
  const float* pg = p + g * p_stride;
  float* og = o + g * o_stride;
  switch (G - g) {
    case 3: return values_heads<3, 3>(pg, p_stride, v, v_off, n, d, og, o_stride);
    case 2: return values_heads<2, 4>(pg, p_stride, v, v_off, n, d, og, o_stride);
    case 1: return values_heads<1, 8>(pg, p_stride, v, v_off, n, d, og, o_stride);
    default: return;
  }
}

CK_AVX2 void exp_nonpositive(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float b[8];
    _mm256_storeu_ps(b, exp8(load_partial(x + i, static_cast<int32_t>(n - i))));
    std::memcpy(y + i, b, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace avx2

// ---- AVX-512 ----------------------------------------------------------------

namespace {

// Keys j and j + 1, lanes [i, i + 8) each: the low half of the result is key
// j's, the high half key j + 1's.
CK_AVX512 inline __m512 load_f16x8_pair(const f16* a, const f16* b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// G heads × 2P consecutive keys: accumulator (g, p) holds key 2p in its low
// 8 lanes and key 2p + 1 in its high 8, q broadcast to both halves, so each
// half runs scores_block's 8-lane sequence exactly.
template <int G, int P>
CK_AVX512 void scores_pairs(const float* q, int64_t q_stride, const f16* const* k, int64_t k_off, int32_t d,
                            float scale, float* s, int64_t s_stride) {
  __m512 acc[G][P];
  for (int g = 0; g < G; ++g)
    for (int p = 0; p < P; ++p) acc[g][p] = _mm512_setzero_ps();
  const int32_t d8 = d & ~7;
  for (int32_t i = 0; i < d8; i += 8) {
    __m512 kv[P];
    for (int p = 0; p < P; ++p) kv[p] = load_f16x8_pair(k[2 * p] + k_off + i, k[2 * p + 1] + k_off + i);
    for (int g = 0; g < G; ++g) {
      const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + g * q_stride + i));
      for (int p = 0; p < P; ++p) acc[g][p] = _mm512_fmadd_ps(qv, kv[p], acc[g][p]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int p = 0; p < P; ++p) {
      const float* qg = q + g * q_stride;
      s[g * s_stride + 2 * p] =
          finish_score(hsum(_mm512_castps512_ps256(acc[g][p])), qg, k[2 * p] + k_off, d8, d, scale);
      s[g * s_stride + 2 * p + 1] =
          finish_score(hsum(_mm512_extractf32x8_ps(acc[g][p], 1)), qg, k[2 * p + 1] + k_off, d8, d, scale);
    }
}

template <int G, int P>
CK_AVX512 void scores_heads_pairs(const float* q, int64_t q_stride, const f16* const* k, int64_t k_off, int32_t n,
                                  int32_t d, float scale, float* s, int64_t s_stride) {
  int32_t j = 0;
  for (; j + 2 * P <= n; j += 2 * P)
    scores_pairs<G, P>(q, q_stride, k + j, k_off, d, scale, s + j, s_stride);
  for (; j + 2 <= n; j += 2) scores_pairs<G, 1>(q, q_stride, k + j, k_off, d, scale, s + j, s_stride);
  for (; j < n; ++j) scores_block<G, 1>(q, q_stride, k + j, k_off, d, scale, s + j, s_stride);
}

// values_block on 16-lane registers: lanes [i0, i0 + 16C).
template <int G, int C>
CK_AVX512 void values_block16(const float* p, int64_t p_stride, const f16* const* v, int64_t v_off, int32_t n, float* o,
                              int64_t o_stride) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_loadu_ps(o + g * o_stride + 16 * c);
  for (int32_t j = 0; j < n; ++j) {
    __m512 vv[C];
    for (int c = 0; c < C; ++c)
      vv[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[j] + v_off + 16 * c)));
    for (int g = 0; g < G; ++g) {
      const __m512 pb = _mm512_set1_ps(p[g * p_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(pb, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + g * o_stride + 16 * c, acc[g][c]);
}

template <int G, int C>
CK_AVX512 void values_heads16(const float* p, int64_t p_stride, const f16* const* v, int64_t v_off, int32_t n,
                              int32_t d, float* o, int64_t o_stride) {
  int32_t i = 0;
  for (; i + 16 * C <= d; i += 16 * C) values_block16<G, C>(p, p_stride, v, v_off + i, n, o + i, o_stride);
  for (; i + 16 <= d; i += 16) values_block16<G, 1>(p, p_stride, v, v_off + i, n, o + i, o_stride);
  for (; i + 8 <= d; i += 8) values_block<G, 1>(p, p_stride, v, v_off + i, n, o + i, o_stride);
  values_tail<G>(p, p_stride, v, v_off, n, i, d, o, o_stride);
}

}  // namespace

namespace avx512 {

// 32 zmm registers: G heads × P key pairs accumulators + P key pairs + one q,
// G · P >= 8 chains.
CK_AVX512 void attention_scores(const float* q, int64_t q_stride, int32_t G, const f16* const* k, int64_t k_off,
                                int32_t n, int32_t d, float scale, float* s, int64_t s_stride) {
  int32_t g = 0;
  for (; g + 4 <= G; g += 4)
    scores_heads_pairs<4, 2>(q + g * q_stride, q_stride, k, k_off, n, d, scale, s + g * s_stride, s_stride);
  const float* qg = q + g * q_stride;
  float* sg = s + g * s_stride;
  switch (G - g) {
    case 3: return scores_heads_pairs<3, 3>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    case 2: return scores_heads_pairs<2, 4>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    case 1: return scores_heads_pairs<1, 8>(qg, q_stride, k, k_off, n, d, scale, sg, s_stride);
    default: return;
  }
}

// G heads × C blocks of 16 lanes accumulators + C value vectors + one p.
CK_AVX512 void attention_values(const float* p, int64_t p_stride, int32_t G, const f16* const* v, int64_t v_off,
                                int32_t n, int32_t d, float* o, int64_t o_stride) {
  int32_t g = 0;
  for (; g + 4 <= G; g += 4)
    values_heads16<4, 4>(p + g * p_stride, p_stride, v, v_off, n, d, o + g * o_stride, o_stride);
  const float* pg = p + g * p_stride;
  float* og = o + g * o_stride;
  switch (G - g) {
    case 3: return values_heads16<3, 4>(pg, p_stride, v, v_off, n, d, og, o_stride);
    case 2: return values_heads16<2, 8>(pg, p_stride, v, v_off, n, d, og, o_stride);
    case 1: return values_heads16<1, 8>(pg, p_stride, v, v_off, n, d, og, o_stride);
    default: return;
  }
}

}  // namespace avx512
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
