// AVX2 integer path of quant_dot.h: the activation quantizer and the
// register tiles of the Q8_0/Q4_0 products (maddubs + madd lane sums, exact,
// then quant_dot.h's f32 FMA per block and lane: the portable bits). The
// AVX-512 ISA runs these tiles too (the same bits).
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

CK_AVX2 inline int u16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// The f16 scales of 8 consecutive blocks (stride BB bytes from p) as f32.
template <int BB>
CK_AVX2 inline __m256 scales8(const uint8_t* p) {
  __m128i h = _mm_cvtsi32_si128(u16_at(p));
  h = _mm_insert_epi16(h, u16_at(p + BB), 1);
  h = _mm_insert_epi16(h, u16_at(p + 2 * BB), 2);
  h = _mm_insert_epi16(h, u16_at(p + 3 * BB), 3);
  h = _mm_insert_epi16(h, u16_at(p + 4 * BB), 4);
  h = _mm_insert_epi16(h, u16_at(p + 5 * BB), 5);
  h = _mm_insert_epi16(h, u16_at(p + 6 * BB), 6);
  h = _mm_insert_epi16(h, u16_at(p + 7 * BB), 7);
  return _mm256_cvtph_ps(h);
}

// The same for g < 8 blocks (the lanes past g are 0).
template <int BB>
CK_AVX2 inline __m256 scales_part(const uint8_t* p, int g) {
  alignas(32) float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < g; ++k) s[k] = _cvtsh_ss(static_cast<unsigned short>(u16_at(p + k * BB)));
  return _mm256_load_ps(s);
}

// One register tile: rows [r0, r0 + R) × columns [c0, c0 + C) (Wc at weight
// row c0, rows rb bytes apart). Blocks go in groups of 8: a group's R × C
// scale products are computed 8 at a time first, then each block pair is
// one integer dot product and one FMA. pf (or nullptr): the C weight rows
// the next tile reads, prefetched group by group.
// Q6_K sub-block s < 8 of the super-block at b: its 32 values q − 32 as
// int8, in element order (quant_cpu.cc: dequant_q6_k's layout; s = 4h + u:
// the low (u < 2) or high nibble of ql[64h + 32(u & 1) + l], bits 2u, 2u + 1
// of qh[32h + l]).
CK_AVX2 inline __m256i q6k_sub(const uint8_t* b, int s) {
  const int h = s >> 2, u = s & 3;
  __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (u & 1)));
  if (u >= 2) lo = _mm256_srli_epi16(lo, 4);
  lo = _mm256_and_si256(lo, _mm256_set1_epi8(0xF));
  __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
  // Bits 2u, 2u + 1 of each byte moved to bits 4, 5.
  if (u == 0) hb = _mm256_slli_epi16(hb, 4);
  else if (u == 1) hb = _mm256_slli_epi16(hb, 2);
  else if (u == 3) hb = _mm256_srli_epi16(hb, 2);
  hb = _mm256_and_si256(hb, _mm256_set1_epi8(0x30));
  return _mm256_sub_epi8(_mm256_or_si256(lo, hb), _mm256_set1_epi8(32));
}

// Q6_K's int8 scales of sub-block s as 16 int16 lanes: sc[2s] for the
// first 8 (values 0-15), sc[2s + 1] for the last 8.
CK_AVX2 inline __m256i q6k_scales16(const uint8_t* b, int s) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
  const __m128i pat = _mm_add_epi8(_mm_set1_epi8(static_cast<char>(2 * s)), _mm_set_epi64x(0x0101010101010101LL, 0));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pat));
}

template <int R, int C, DType WT>
CK_AVX2 void itile(const Q8Rows& x, const uint8_t* Wc, int64_t rb, const float* bias, float* y, int32_t N,
                   int32_t r0, int32_t c0, const uint8_t* pf) {
  // Bytes per activation block (Q6_K: per super-block of 8, read per group).
  constexpr int BB = WT == DType::Q8_0 ? 34 : WT == DType::Q4_0 ? 18 : WT == DType::Q6_K ? 210 : 144;
  constexpr bool kSuper = WT == DType::Q6_K || WT == DType::Q4_K;
  const int32_t nb = x.K / 32;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i hi4 = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  __m256 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  alignas(32) float sc[R][C][8];
  alignas(32) float sm[kSuper ? R : 1][kSuper ? C : 1][8];  // Q4_K: −dmin · d_x
  for (int32_t b0 = 0; b0 < nb; b0 += 8) {
    const int g = std::min<int32_t>(8, nb - b0);
    if constexpr (kSuper) {
      // Q4_K/Q6_K: a group is one super-block; its lines of the next tile's rows at once.
      const int64_t lo = b0 == 0 ? 0 : (static_cast<int64_t>(b0 / 8) * BB + 63) & ~int64_t{63};
      const int64_t hi = static_cast<int64_t>((b0 + g) / 8) * BB;
      if (pf != nullptr)
        for (int c = 0; c < C; ++c)
          for (int64_t o = lo; o < hi; o += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + c * rb + o), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      __m256 dw;
      if constexpr (kSuper) {
        // One f16 d per super-block (a group is one; K is whole super-blocks).
        const uint8_t* p = Wc + c * rb + static_cast<int64_t>(b0 / 8) * BB;
        dw = _mm256_set1_ps(_cvtsh_ss(static_cast<unsigned short>(u16_at(p + (WT == DType::Q6_K ? 208 : 0)))));
        if constexpr (WT == DType::Q4_K) {
          const __m256 dm = _mm256_set1_ps(_cvtsh_ss(static_cast<unsigned short>(u16_at(p + 2))));
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            _mm256_store_ps(sm[r][c], _mm256_xor_ps(_mm256_set1_ps(-0.0f),
                                                    _mm256_mul_ps(dm, _mm256_loadu_ps(x.d + static_cast<int64_t>(r0 + r) * nb + b0))));
        }
      } else {
        const uint8_t* p = Wc + c * rb + static_cast<int64_t>(b0) * BB;
        dw = g == 8 ? scales8<BB>(p) : scales_part<BB>(p, g);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
        _mm256_store_ps(sc[r][c], _mm256_mul_ps(dw, _mm256_loadu_ps(x.d + static_cast<int64_t>(r0 + r) * nb + b0)));
    }
    for (int k = 0; k < g; ++k) {
      const int64_t b = b0 + k;
      if constexpr (!kSuper) {
        // Q8_0/Q4_0: a line of each of the next tile's rows as this block's
        // last byte enters it, spread over the tile (one burst of C · 4 lines
        // per group left a Zen 1 core's loads waiting on memory).
        const int64_t end = b * BB + BB - 1;
        if (pf != nullptr && (b == 0 || (end >> 6) != ((end - BB) >> 6)))
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(pf + c * rb + end), _MM_HINT_T0);
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        if constexpr (WT == DType::Q4_K) {
          // Nibbles (0..15) unsigned against x, madd by the 6-bit scale:
          // lane l = sc · Σ q · x (≤ 2^19); the mins: m · Σ x per lane.
          const uint8_t* sb = Wc + c * rb + static_cast<int64_t>(b0 / 8) * BB;
          int scv, mv;
          q4k_scale_min(k, sb + 4, &scv, &mv);
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 16 + 32 * (k >> 1)));
          const __m256i nib = _mm256_and_si256((k & 1) != 0 ? _mm256_srli_epi16(v, 4) : v, m4);
          const __m256i sc16 = _mm256_set1_epi16(static_cast<short>(scv));
          const __m256i m16 = _mm256_set1_epi16(static_cast<short>(mv));
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int64_t xb = static_cast<int64_t>(r0 + r) * nb + b;
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + xb * 32));
            const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(nib, xv), sc16);
            const __m256i pm = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xv), m16);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pa), _mm256_broadcast_ss(&sc[r][c][k]), acc[r][c]);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_broadcast_ss(&sm[r][c][k]), acc[r][c]);
          }
          continue;
        }
        if constexpr (WT == DType::Q6_K) {
          // |q − 32| · (x with its sign), pairs ≤ 2 · 32 · 127; madd by the
          // 16-value scales: lane l = sc · Σ (q − 32) · x, ≤ 2^21 (exact).
          const uint8_t* sb = Wc + c * rb + static_cast<int64_t>(b0 / 8) * BB;
          const __m256i qv = q6k_sub(sb, k);
          const __m256i aq = _mm256_abs_epi8(qv);
          const __m256i sc16 = q6k_scales16(sb, k);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int64_t xb = static_cast<int64_t>(r0 + r) * nb + b;
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + xb * 32));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, qv)), sc16);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[r][c][k]), acc[r][c]);
          }
          continue;
        }
        const uint8_t* wb = Wc + c * rb + b * BB + 2;
        if constexpr (WT == DType::Q8_0) {
          // |w| · (x with w's sign): the unsigned operand is |w| ≤ 128, so
          // w = −128 is exact too, and a pair sum ≤ 2 · 128 · 127 fits int16.
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb));
          const __m256i aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int64_t xb = static_cast<int64_t>(r0 + r) * nb + b;
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + xb * 32));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones16);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[r][c][k]), acc[r][c]);
          }
        } else {
          // The nibbles (0..15) unsigned against x, less 8 · x's lane sums.
          // The 16 bytes in both halves, the high half shifted right by 4
          // (per 32-bit lane; the AND drops the bits from the next byte):
          // one shift where an extract and an insert took two.
          const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
          const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(v, hi4), m4);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int64_t xb = static_cast<int64_t>(r0 + r) * nb + b;
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + xb * 32));
            const __m256i s8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.s8 + xb * 8));
            const __m256i p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(nib, xv), ones16), s8);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[r][c][k]), acc[r][c]);
          }
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

// Row quads on 4 × 2 tiles (each weight block unpacked once for 4 rows),
// then the leftover rows one at a time on 1 × 8 tiles (8 weight rows
// streamed at once; with no quads before them the first one prefetches the
// next tile's rows, past n1 too: the next work item is usually this
// thread's or its neighbour's).
template <DType WT>
CK_AVX2 void columns(const Q8Rows& x, const void* W, int32_t N, const float* bias, float* y, int32_t n0,
                     int32_t n1) {
  const int64_t rb = bytes_of(WT, x.K);
  const auto* w = static_cast<const uint8_t*>(W);
  auto row = [&](int32_t c) { return w + c * rb; };
  const int32_t T4 = x.T & ~3;
  for (int32_t r = 0; r < T4; r += 4) {
    int32_t c = n0;
    for (; c + 2 <= n1; c += 2)
      itile<4, 2, WT>(x, row(c), rb, bias, y, N, r, c, r == 0 && c + 4 <= N ? row(c + 2) : nullptr);
    if (c < n1) itile<4, 1, WT>(x, row(c), rb, bias, y, N, r, c, nullptr);
  }
  for (int32_t r = T4; r < x.T; ++r) {
    const bool stream = T4 == 0 && r == 0;
    int32_t c = n0;
    for (; c + 8 <= n1; c += 8)
      itile<1, 8, WT>(x, row(c), rb, bias, y, N, r, c, stream && c + 16 <= N ? row(c + 8) : nullptr);
    const uint8_t* Wc = row(c);
    switch (n1 - c) {
      case 7: itile<1, 7, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 6: itile<1, 6, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 5: itile<1, 5, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 4: itile<1, 4, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 3: itile<1, 3, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 2: itile<1, 2, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      case 1: itile<1, 1, WT>(x, Wc, rb, bias, y, N, r, c, nullptr); break;
      default: break;
    }
  }
}

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
  switch (wt) {
    case DType::Q8_0: columns<DType::Q8_0>(x, W, N, bias, y, n0, n1); break;
    case DType::Q4_0: columns<DType::Q4_0>(x, W, N, bias, y, n0, n1); break;
    case DType::Q6_K: columns<DType::Q6_K>(x, W, N, bias, y, n0, n1); break;
    case DType::Q4_K: columns<DType::Q4_K>(x, W, N, bias, y, n0, n1); break;
    default: break;  // int8_path() types only
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
