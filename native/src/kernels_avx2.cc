// AVX2 + FMA + F16C primitives. Every function carries the target attribute
// instead of the file being compiled with -mavx2, so no AVX2 code can leak
// into the baseline paths through shared inline functions; these run only
// after cpu_features() has confirmed the CPU supports them.
#include "cpu.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <vector>

#define CK_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace ck {
namespace avx2 {
namespace {

// The one horizontal sum: lanes (0+4, 1+5, 2+6, 3+7), then (0+4+2+6,
// 1+5+3+7), then their sum. Every reduction below ends with it.
CK_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

CK_AVX2 inline float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

CK_AVX2 inline __m256 load_f16x8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

CK_AVX2 inline __m256 load_bf16x8(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

template <DType WT>
CK_AVX2 inline __m256 load_w8(const void* W, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(W) + i);
  } else if constexpr (WT == DType::F16) {
    return load_f16x8(static_cast<const f16*>(W) + i);
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
  return static_cast<const uint8_t*>(W) + row * K * dtype_bytes(WT);
}

// One register tile: rows [r0, r0+R) × columns [c0, c0+C); Wc points at
// weight row c0 (row c0 + c at element c·K). Each element has its own 8-lane
// accumulator walked over k ascending, so its value is the same for any R
// and C, and for f32 weights the same as for the bf16/f16 weights they were
// exactly converted from.
//
// pf (or nullptr) points at the weight rows the NEXT tile will read, C rows
// of K elements of PF: they are prefetched one cache line per row as k
// reaches it, so the memory stream of the next tile overlaps this tile's
// FMAs (the hardware prefetcher alone leaves the core waiting at the start of
// every tile).
template <int R, int C, DType WT, DType PF = WT>
CK_AVX2 void tile(const float* x, int32_t K, const void* Wc, const float* bias, float* y, int32_t N, int32_t r0,
                  int32_t c0, const void* pf = nullptr) {
  constexpr int32_t kLine = static_cast<int32_t>(64 / (PF == DType::F32 ? 4 : 2));  // PF elements per line
  const char* pfb = static_cast<const char*>(pf);
  const int64_t pf_row = static_cast<int64_t>(K) * (PF == DType::F32 ? 4 : 2);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int32_t K8 = K & ~7;
  for (int32_t k = 0; k < K8; k += 8) {
    if (pfb != nullptr && k % kLine == 0)
      for (int c = 0; c < C; ++c) _mm_prefetch(pfb + c * pf_row + k * (64 / kLine), _MM_HINT_T0);
    __m256 w[C];
    for (int c = 0; c < C; ++c) w[c] = load_w8<WT>(Wc, static_cast<int64_t>(c) * K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + static_cast<int64_t>(r0 + r) * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + static_cast<int64_t>(r0 + r) * K;
    for (int c = 0; c < C; ++c) {
      const int64_t wrow = static_cast<int64_t>(c) * K;
      float s = hsum(acc[r][c]);
      for (int32_t k = K8; k < K; ++k) s = fma1(xr[k], load_w1<WT>(Wc, wrow + k), s);
      if (bias != nullptr) s += bias[c0 + c];
      y[static_cast<int64_t>(r0 + r) * N + c0 + c] = s;
    }
  }
}

// rows [0, C) of W (a pointer at its row c0) as f32 into out [C, K]: exact,
// so a tile over `out` computes the same bits as one over W.
template <int C, DType WT>
CK_AVX2 void widen_rows(const void* Wc, int32_t K, float* out) {
  const int32_t K8 = K & ~7;
  for (int c = 0; c < C; ++c) {
    const int64_t row = static_cast<int64_t>(c) * K;
    for (int32_t k = 0; k < K8; k += 8) _mm256_storeu_ps(out + row + k, load_w8<WT>(Wc, row + k));
    for (int32_t k = K8; k < K; ++k) out[row + k] = load_w1<WT>(Wc, row + k);
  }
}

// The widened weight rows of the current column triplet, per thread.
thread_local std::vector<float> tl_wide;

// Register budget (16 ymm): 4 rows × 3 columns = 12 accumulators + 3 weight
// vectors; a single row takes 8 columns (8 accumulators + 8 weight vectors).
// Loop order: column triplets outside, row quads inside, so a triplet's
// weight rows come from memory once and stay in L1 for every row quad. With
// several row quads, 16-bit weights are first widened to f32 (exact) so the
// quads share one conversion and the inner loop is loads and FMAs only
// (the bf16 shift would otherwise take an FMA port every third FMA).
// Rows [0, T4) of columns [n0, n1), T4 a multiple of 4.
template <DType WT>
CK_AVX2 void quads(const float* x, int32_t T4, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                   int32_t n0, int32_t n1) {
  if (T4 == 0) return;
  const bool widen = WT != DType::F32 && T4 >= 8;
  if (widen && tl_wide.size() < static_cast<size_t>(3) * K) tl_wide.resize(static_cast<size_t>(3) * K);
  int32_t c = n0;
  for (; c + 3 <= n1; c += 3) {
    const void* Wc = weight_row<WT>(W, c, K);
    // The first quad prefetches the next triplet's rows.
    const void* next = c + 6 <= N ? weight_row<WT>(W, c + 3, K) : nullptr;
    if (widen) {
      widen_rows<3, WT>(Wc, K, tl_wide.data());
      for (int32_t r = 0; r < T4; r += 4)
        tile<4, 3, DType::F32, WT>(x, K, tl_wide.data(), bias, y, N, r, c, r == 0 ? next : nullptr);
    } else {
      for (int32_t r = 0; r < T4; r += 4) tile<4, 3, WT>(x, K, Wc, bias, y, N, r, c, r == 0 ? next : nullptr);
    }
  }
  const void* Wc = weight_row<WT>(W, c, K);
  for (int32_t r = 0; r < T4; r += 4) {
    switch (n1 - c) {
      case 2: tile<4, 2, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 1: tile<4, 1, WT>(x, K, Wc, bias, y, N, r, c); break;
      default: break;
    }
  }
}

// Rows [r0, T) one at a time, columns [n0, n1).
template <DType WT>
CK_AVX2 void single_rows(const float* x, int32_t r0, int32_t T, int32_t K, const void* W, int32_t N,
                         const float* bias, float* y, int32_t n0, int32_t n1) {
  for (int32_t r = r0; r < T; ++r) {
    int32_t c = n0;
    // Only the first single row streams the weights from memory; it
    // prefetches the next 8 rows (past n1 too: the next block is usually
    // this thread's or its neighbour's next one, and the lines land in the
    // shared L3 either way).
    for (; c + 8 <= n1; c += 8)
      tile<1, 8, WT>(x, K, weight_row<WT>(W, c, K), bias, y, N, r, c,
                     r == r0 && c + 16 <= N ? weight_row<WT>(W, c + 8, K) : nullptr);
    const void* Wc = weight_row<WT>(W, c, K);
    switch (n1 - c) {
      case 7: tile<1, 7, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 6: tile<1, 6, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 5: tile<1, 5, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 4: tile<1, 4, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 3: tile<1, 3, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 2: tile<1, 2, WT>(x, K, Wc, bias, y, N, r, c); break;
      case 1: tile<1, 1, WT>(x, K, Wc, bias, y, N, r, c); break;
      default: break;
    }
  }
}

template <DType WT>
CK_AVX2 void columns(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias,
                     float* y, int32_t n0, int32_t n1) {
  const int32_t T4 = T & ~3;
  quads<WT>(x, T4, K, W, N, bias, y, n0, n1);
  single_rows<WT>(x, T4, T, K, W, N, bias, y, n0, n1);
}

// ---- 512-bit column pairs (Isa::Avx512) ----------------------------------
// A tile is R rows × P column pairs (see kRows, kPairs below for the
// register budget). The low half of accumulator (r, p) is
// element (r, c0 + 2p), the high half element (r, c0 + 2p + 1); x's 8 values
// are broadcast to both halves, so each half runs exactly the 8-lane FMA
// sequence of `tile`, then the same hsum and scalar tail: the same bits.

#define CK_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq")))

// Rows c0 .. c0 + 2P - 1 of W (Wc points at row c0), k < K & ~7, as f32 in
// pair order: out[(p · K8 + k) · 2 + h · 8 + i] = W[c0 + 2p + h][k + i].
template <int P, DType WT>
CK_AVX2 void widen_pairs(const void* Wc, int32_t K, float* out) {
  const int32_t K8 = K & ~7;
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < 2; ++h) {
      const int64_t row = static_cast<int64_t>(2 * p + h) * K;
      float* o = out + static_cast<int64_t>(p) * K8 * 2 + h * 8;
      for (int32_t k = 0; k < K8; k += 8) _mm256_storeu_ps(o + 2 * k, load_w8<WT>(Wc, row + k));
    }
}

template <int R, int P, DType WT>
CK_AVX512 void tile_pairs(const float* x, int32_t K, const float* wide, const void* Wc, const float* bias, float* y,
                          int32_t N, int32_t r0, int32_t c0, const void* pf) {
  constexpr int32_t kLine = static_cast<int32_t>(64 / (WT == DType::F32 ? 4 : 2));
  const char* pfb = static_cast<const char*>(pf);
  const int64_t pf_row = static_cast<int64_t>(K) * (WT == DType::F32 ? 4 : 2);
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const int32_t K8 = K & ~7;
  for (int32_t k = 0; k < K8; k += 8) {
    if (pfb != nullptr && k % kLine == 0)
      for (int c = 0; c < 2 * P; ++c) _mm_prefetch(pfb + c * pf_row + k * (64 / kLine), _MM_HINT_T0);
    __m512 w[P];
    for (int p = 0; p < P; ++p) w[p] = _mm512_loadu_ps(wide + (static_cast<int64_t>(p) * K8 + k) * 2);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + static_cast<int64_t>(r0 + r) * K + k));
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xv, w[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + static_cast<int64_t>(r0 + r) * K;
    for (int p = 0; p < P; ++p) {
      for (int h = 0; h < 2; ++h) {
        const int c = 2 * p + h;
        const __m256 half = h == 0 ? _mm512_castps512_ps256(acc[r][p]) : _mm512_extractf32x8_ps(acc[r][p], 1);
        const int64_t wrow = static_cast<int64_t>(c) * K;
        float s = hsum(half);
        for (int32_t k = K8; k < K; ++k) s = fma1(xr[k], load_w1<WT>(Wc, wrow + k), s);
        if (bias != nullptr) s += bias[c0 + c];
        y[static_cast<int64_t>(r0 + r) * N + c0 + c] = s;
      }
    }
  }
}

thread_local std::vector<float> tl_wide_pairs;

// Batch tile: kRows rows × kPairs column pairs = 24 accumulators, 3 weight
// vectors and one broadcast x (28 of 32 zmm). Measured on the small preset's
// batch-16 decode step (interleaved, CPU time per step): 8 × 3 took ~20%
// less than 4 × 3 (half the weight loads per FMA) and 4 × 6 ~5% less (fewer
// x loads per FMA, but a 12-column widened group spills out of L1).
constexpr int kRows = 8;
constexpr int kPairs = 3;

// As columns(), but batches of 8+ rows run groups of 2·kPairs columns on
// 512-bit registers, kRows rows per tile (then row quads); leftover columns
// and rows take the 256-bit tiles. Each column group's weights are widened
// once and reused by every row tile, so a larger kRows halves the weight
// loads per FMA.
template <DType WT>
CK_AVX512 void columns_pairs(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias,
                             float* y, int32_t n0, int32_t n1) {
  constexpr int32_t G = 2 * kPairs;
  const int32_t T4 = T & ~3;
  if (T4 < 8) return columns<WT>(x, T, K, W, N, bias, y, n0, n1);
  const int32_t TR = T - T % kRows;
  if (tl_wide_pairs.size() < static_cast<size_t>(G) * K) tl_wide_pairs.resize(static_cast<size_t>(G) * K);
  float* wide = tl_wide_pairs.data();
  int32_t c = n0;
  for (; c + G <= n1; c += G) {
    const void* Wc = weight_row<WT>(W, c, K);
    // The first row tile prefetches the next group's rows.
    const void* next = c + 2 * G <= N ? weight_row<WT>(W, c + G, K) : nullptr;
    widen_pairs<kPairs, WT>(Wc, K, wide);
    for (int32_t r = 0; r < TR; r += kRows)
      tile_pairs<kRows, kPairs, WT>(x, K, wide, Wc, bias, y, N, r, c, r == 0 ? next : nullptr);
    for (int32_t r = TR; r < T4; r += 4)
      tile_pairs<4, kPairs, WT>(x, K, wide, Wc, bias, y, N, r, c, r == 0 ? next : nullptr);
  }
  quads<WT>(x, T4, K, W, N, bias, y, c, n1);
  single_rows<WT>(x, T4, T, K, W, N, bias, y, n0, n1);
}

}  // namespace

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

CK_AVX2 void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                            const float* bias, float* y, int32_t n0, int32_t n1) {
  switch (wt) {
    case DType::F32: columns<DType::F32>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::F16: columns<DType::F16>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::BF16: columns<DType::BF16>(x, T, K, W, N, bias, y, n0, n1); break;
  }
}

CK_AVX512 void matmul_columns_pairs(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                                   const float* bias, float* y, int32_t n0, int32_t n1) {
  switch (wt) {
    case DType::F32: columns_pairs<DType::F32>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::F16: columns_pairs<DType::F16>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::BF16: columns_pairs<DType::BF16>(x, T, K, W, N, bias, y, n0, n1); break;
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
