// Block-quantized weights in registers (quant.h's formats and exact values):
// the register tiles of a decode-sized product over Q8_0/Q4_0/Q4_K/Q6_K
// weights, so the product streams the blocks and never writes dequantized
// weights to memory. Include only from AVX2-attributed code.
//
// A tile walks each weight row in sub-blocks of 32 values: the sub-block's
// scales are decoded once (one f16 per block, plus Q4_K's 6-bit scale and
// min or Q6_K's two int8 scales per sub-block), its 32 quants unpacked into
// one register, and each group of 8 values is then one widen, one convert
// and one multiply (Q4_K: and a subtract) before its FMA. The values are
// the exact ones of quant.h (the same IEEE operations on the same operands
// as the portable dequantizer), and each output still accumulates 8 lanes
// over k ascending: the same bits as the f32 tile over the dequantized rows.
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

// The f16 at p as f32 (exact), through F16C: quant.h's half_at is an
// out-of-line portable conversion, too slow for once per sub-block.
CK_AVX2 inline float half1(const uint8_t* p) { return _mm256_cvtss_f32(half8(p)); }

// 8 bytes at p as 8 int32 lanes, zero-extended (one load-and-extend).
CK_AVX2 inline __m256i bytes8_u32(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Bytes [8g, 8g + 8) of a 32-byte register as 8 int32 lanes (signed or
// unsigned widening; every quant here fits either).
template <bool Signed>
CK_AVX2 inline __m256i widen8(__m256i q, int g) {
  const __m128i half = g < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
  const __m128i v = (g & 1) != 0 ? _mm_unpackhi_epi64(half, half) : half;
  return Signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// Sub-block s (values [32s, 32s + 32)) of the block at b, as 4 groups of 8
// exact f32 values: QSub<WT>(b, s).group(g), g < 4.
template <DType WT>
struct QSub;

// x = d·q, q int8.
template <>
struct QSub<DType::Q8_0> {
  static constexpr int kElems = 32, kBytes = 34;
  const uint8_t* q;
  __m256 d;
  CK_AVX2 QSub(const uint8_t* b, int) : q(b + 2), d(half8(b)) {}
  CK_AVX2 __m256 group(int g) const {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
  }
};

// x_j = d·((q[j] & 15) − 8), x_{j+16} = d·((q[j] >> 4) − 8): group g < 2
// is the low nibbles of q[8g, 8g + 8), group g ≥ 2 the high nibbles of
// q[8(g − 2), ...), each read with one load-and-extend (no shuffles of a
// 32-value register).
template <>
struct QSub<DType::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18;
  const uint8_t* q;
  __m256 d;
  CK_AVX2 QSub(const uint8_t* b, int) : q(b + 2), d(half8(b)) {}
  CK_AVX2 __m256 group(int g) const {
    const __m256i v = bytes8_u32(q + 8 * (g & 1));
    const __m256i n = g < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8))));
  }
};

// Sub-block s = group 2c + h of chunk c: the low (h = 0) or high nibbles of
// q[32c, 32c + 32); x = (d·sc)·q − dmin·m.
// (d·sc)·q is exact (quant.h), so one fused multiply-subtract rounds the
// difference once, as the multiply-then-subtract does.
template <>
struct QSub<DType::Q4_K> {
  static constexpr int kElems = 256, kBytes = 144;
  const uint8_t* q;  // the 32 bytes whose low (s even) or high nibbles are sub-block s
  bool high;
  __m256 d1, m1;
  CK_AVX2 QSub(const uint8_t* b, int s) : q(b + 16 + 32 * (s >> 1)), high((s & 1) != 0) {
    int sc, m;
    q4k_scale_min(s, b + 4, &sc, &m);
    d1 = _mm256_set1_ps(half1(b) * static_cast<float>(sc));
    m1 = _mm256_set1_ps(half1(b + 2) * static_cast<float>(m));
  }
  CK_AVX2 __m256 group(int g) const {
    const __m256i v = bytes8_u32(q + 8 * g);
    const __m256i n = high ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
    return _mm256_fmsub_ps(d1, _mm256_cvtepi32_ps(n), m1);
  }
};

// Sub-block s = quarter u of half h (s = 4h + u): element l < 32 takes the
// low (u < 2) or high nibble of ql[64h + 32(u & 1) + l] and bits 2u, 2u + 1
// of qh[32h + l]; x = (d·sc)·(q − 32) with scale sc[8h + 2u] for l < 16 and
// sc[8h + 2u + 1] above (quant_cpu.cc: dequant_q6_k).
template <>
struct QSub<DType::Q6_K> {
  static constexpr int kElems = 256, kBytes = 210;
  // ds: d·sc_i for the block's 16 scales (q6k_scales), computed once per
  // block and column.
  __m256i q;  // q − 32 as int8
  __m256 d_lo, d_hi;
  CK_AVX2 QSub(const uint8_t* b, int s, const float* ds) {
    const int h = s >> 2, u = s & 3;
    d_lo = _mm256_broadcast_ss(ds + 8 * h + 2 * u);
    d_hi = _mm256_broadcast_ss(ds + 8 * h + 2 * u + 1);
    __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (u & 1)));
    if (u >= 2) lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0xF));
    __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    // Bits 2u, 2u + 1 of each byte moved to bits 4, 5 (s is a constant once qtile unrolls its loop).
    if (u == 0) hb = _mm256_slli_epi16(hb, 4);
    else if (u == 1) hb = _mm256_slli_epi16(hb, 2);
    else if (u == 3) hb = _mm256_srli_epi16(hb, 2);
    hb = _mm256_and_si256(hb, _mm256_set1_epi8(0x30));
    q = _mm256_sub_epi8(_mm256_or_si256(lo, hb), _mm256_set1_epi8(32));
  }
  CK_AVX2 __m256 group(int g) const {
    return _mm256_mul_ps(g < 2 ? d_lo : d_hi, _mm256_cvtepi32_ps(widen8<true>(q, g)));
  }
};

// Q6_K's 16 products d·sc_i of the block at b into ds (the same IEEE
// product as the portable dequantizer's).
CK_AVX2 inline void q6k_scales(const uint8_t* b, float* ds) {
  const __m256 d = half8(b + 208);
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
  _mm256_storeu_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
  _mm256_storeu_ps(ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

// Sub-block s of the block at b (ds: its Q6_K scale products, else unused).
template <DType WT>
CK_AVX2 inline QSub<WT> sub_block(const uint8_t* b, int s, const float* ds) {
  if constexpr (WT == DType::Q6_K) {
    return QSub<WT>(b, s, ds);
  } else {
    (void)ds;
    return QSub<WT>(b, s);
  }
}

// One register tile over quantized weights: rows [r0, r0 + R) × columns
// [c0, c0 + C); Wc points at weight row c0 (row c0 + c at c · rb bytes).
// Each element has its own 8-lane accumulator walked over k ascending (the
// f32 tile's order). Sub-blocks run column by column, so the C columns'
// FMA chains are independent and overlap.
//
// pf (or nullptr) points at the C weight rows the NEXT tile reads: the lines
// of its block b are prefetched while this tile works on block b, so the
// next tile's stream overlaps this one's arithmetic.
template <int R, int C, DType WT>
CK_AVX2 void qtile(const float* x, int32_t K, const uint8_t* Wc, int64_t rb, const float* bias, float* y,
                   int32_t N, int32_t r0, int32_t c0, const uint8_t* pf) {
  constexpr int kE = QSub<WT>::kElems, kB = QSub<WT>::kBytes;
  // Every loop over r, c and g is unrolled: the accumulators must be
  // registers (a loop GCC leaves rolled keeps acc[r][c] on the stack, one
  // store and reload per FMA chain step).
  __m256 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* xr = x + static_cast<int64_t>(r0) * K;
  const int32_t blocks = K / kE;
  for (int32_t b = 0; b < blocks; ++b) {
    if (pf != nullptr) {
      // The lines block b ends in that block b − 1 did not.
      const int64_t last = (static_cast<int64_t>(b + 1) * kB - 1) >> 6;
      for (int64_t l = b == 0 ? 0 : ((static_cast<int64_t>(b) * kB - 1) >> 6) + 1; l <= last; ++l)
        for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(pf + c * rb + l * 64), _MM_HINT_T0);
    }
    const uint8_t* Wb = Wc + static_cast<int64_t>(b) * kB;
    float ds[WT == DType::Q6_K ? C : 1][16];
    if constexpr (WT == DType::Q6_K)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) q6k_scales(Wb + c * rb, ds[c]);
#pragma GCC unroll 8
    for (int s = 0; s < kE / 32; ++s) {
      const float* xk = xr + static_cast<int64_t>(b) * kE + 32 * s;
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const QSub<WT> q = sub_block<WT>(Wb + c * rb, s, ds[WT == DType::Q6_K ? c : 0]);
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          const __m256 w = q.group(g);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + static_cast<int64_t>(r) * K + 8 * g), w, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = simd::hsum(acc[r][c]);
      if (bias != nullptr) s += bias[c0 + c];
      y[static_cast<int64_t>(r0 + r) * N + c0 + c] = s;
    }
}

// Row quads [0, T4) of columns [n0, n1) over quantized W on 4 × 3 tiles:
// each weight is decoded once for four rows.
template <DType WT>
CK_AVX2 void quant_quads(const float* x, int32_t T4, int32_t K, const void* W, int32_t N, const float* bias,
                         float* y, int32_t n0, int32_t n1) {
  const int64_t rb = bytes_of(WT, K);
  const auto* w = static_cast<const uint8_t*>(W);
  auto row = [&](int32_t c) { return w + c * rb; };
  for (int32_t r = 0; r < T4; r += 4) {
    int32_t c = n0;
    for (; c + 3 <= n1; c += 3)
      qtile<4, 3, WT>(x, K, row(c), rb, bias, y, N, r, c, r == 0 && c + 6 <= N ? row(c + 3) : nullptr);
    switch (n1 - c) {
      case 2: qtile<4, 2, WT>(x, K, row(c), rb, bias, y, N, r, c, nullptr); break;
      case 1: qtile<4, 1, WT>(x, K, row(c), rb, bias, y, N, r, c, nullptr); break;
      default: break;
    }
  }
}

// Rows [r0, T) one at a time, columns [n0, n1), on 1 × 8 tiles (8 weight
// rows streamed at once), the leftover columns on a narrower one. With no
// quads before them (stream = true) the first row streams the weights from
// memory and prefetches the next 8 rows, past n1 too (the next work item is
// usually this thread's or its neighbour's).
template <DType WT>
CK_AVX2 void quant_single_rows(const float* x, int32_t r0, int32_t T, int32_t K, const void* W, int32_t N,
                               const float* bias, float* y, int32_t n0, int32_t n1, bool stream) {
  const int64_t rb = bytes_of(WT, K);
  const auto* w = static_cast<const uint8_t*>(W);
  auto row = [&](int32_t c) { return w + c * rb; };
  for (int32_t r = r0; r < T; ++r) {
    const bool first = stream && r == r0;
    int32_t c = n0;
    for (; c + 8 <= n1; c += 8)
      qtile<1, 8, WT>(x, K, row(c), rb, bias, y, N, r, c, first && c + 16 <= N ? row(c + 8) : nullptr);
    const uint8_t* Wc = row(c);
    switch (n1 - c) {
      case 7: qtile<1, 7, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 6: qtile<1, 6, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 5: qtile<1, 5, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 4: qtile<1, 4, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 3: qtile<1, 3, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 2: qtile<1, 2, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 1: qtile<1, 1, WT>(x, K, Wc, rb, bias, y, N, r, c, nullptr); break;
      default: break;
    }
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
