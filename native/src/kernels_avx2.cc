// AVX2 + FMA + F16C GEMM tiles (and the AVX-512 column pairs; row pairs in
// gemm_avx512.cc). Every function carries its target attribute (simd_x86.h)
// instead of the file being compiled with -mavx2, so no vector code can leak
// into the baseline paths; they run only once cpu_features() confirms the CPU.
#include "gemm_avx2.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace ck {
namespace avx2 {
namespace {

using simd::fma1;
using simd::hsum;

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
  // PF elements per 64-byte line.
  constexpr int32_t kLine = 64 / (PF == DType::F32 ? 4 : 2);
  const char* pfb = static_cast<const char*>(pf);
  const int64_t pf_row = bytes_of(PF, K);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int32_t K8 = K & ~7;
  for (int32_t k = 0; k < K8; k += 8) {
    if (pfb != nullptr && k % kLine == 0)
      for (int c = 0; c < C; ++c) _mm_prefetch(pfb + c * pf_row + static_cast<int64_t>(k) * pf_row / K, _MM_HINT_T0);
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

// ---- Row quads over K blocks (batches of 8+ rows) ------------------------
// The column triplets of a work item are widened to f32 once (exact), then
// each block of kQuadRows rows runs K in blocks of kQuadK: per block, every
// triplet × row-quad tile continues its accumulators from memory (an exact
// store and reload), so a tile reads its x rows and weights from L1 (the x
// block, 16 rows · kQuadK floats, stays there across the triplets) instead
// of streaming all T rows of x from the last-level cache once per triplet.
// Each element still runs `tile`'s 8-lane FMA sequence over k ascending,
// then its hsum, scalar tail and bias: the same bits.
constexpr int32_t kQuadRows = 16;
constexpr int32_t kQuadK = 256;

thread_local std::vector<float> tl_wide_item;
thread_local std::vector<float> tl_quad_acc;

// Accumulators of rows [0, 4) × 3 columns over k in [0, n) (n a multiple of
// 8): xr at row 0, k0 (row stride K); w at column 0, k0 (column stride K).
template <bool kFirst>
CK_AVX2 void quad_block(const float* xr, const float* w, int32_t K, int32_t n, float* acc_mem) {
  __m256 acc[4][3];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) acc[r][c] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_mem + (r * 3 + c) * 8);
  for (int32_t k = 0; k < n; k += 8) {
    __m256 wv[3];
    for (int c = 0; c < 3; ++c) wv[c] = _mm256_loadu_ps(w + static_cast<int64_t>(c) * K + k);
    for (int r = 0; r < 4; ++r) {
      const __m256 xv = _mm256_loadu_ps(xr + static_cast<int64_t>(r) * K + k);
      for (int c = 0; c < 3; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) _mm256_storeu_ps(acc_mem + (r * 3 + c) * 8, acc[r][c]);
}

// Rows [0, T4) (T4 a multiple of 4) of the column triplets in [n0, n0 + 3·nt).
template <DType WT>
CK_AVX2 void quads_blocked(const float* x, int32_t T4, int32_t K, const void* W, int32_t N, const float* bias,
                           float* y, int32_t n0, int32_t nt) {
  const int32_t K8 = K & ~7;
  const float* wide = nullptr;
  if constexpr (WT == DType::F32) {
    wide = static_cast<const float*>(W) + static_cast<int64_t>(n0) * K;
  } else {
    const size_t need = static_cast<size_t>(3) * nt * K;
    if (tl_wide_item.size() < need) tl_wide_item.resize(need);
    for (int32_t t = 0; t < nt; ++t)
      widen_rows<3, WT>(weight_row<WT>(W, n0 + 3 * t, K), K, tl_wide_item.data() + static_cast<size_t>(3) * t * K);
    wide = tl_wide_item.data();
  }
  constexpr int32_t kTileAcc = 4 * 3 * 8;
  const size_t acc_need = static_cast<size_t>(kQuadRows / 4) * nt * kTileAcc;
  if (tl_quad_acc.size() < acc_need) tl_quad_acc.resize(acc_need);
  float* accs = tl_quad_acc.data();
  // The next work item's weight rows (as many rows after this item's; the
  // column blocks go out in runs per thread, so usually this thread's next
  // item: kernels_cpu.cc column_grain) are prefetched a few lines
  // per triplet block, so their stream from memory overlaps these FMAs
  // instead of stalling the next item's widening. Lines per block: the
  // item's lines over its triplet blocks, rounded up.
  const int32_t next_rows = std::max(0, std::min(3 * nt, N - (n0 + 3 * nt)));
  const char* pf = next_rows > 0 ? static_cast<const char*>(weight_row<WT>(W, n0 + 3 * nt, K)) : nullptr;
  const int64_t pf_lines = (static_cast<int64_t>(next_rows) * bytes_of(WT, K) + 63) / 64;
  const int64_t blocks = static_cast<int64_t>((T4 + kQuadRows - 1) / kQuadRows) * ((K8 + kQuadK - 1) / kQuadK) * nt;
  const int64_t pf_per_block = blocks > 0 ? (pf_lines + blocks - 1) / blocks : 0;
  int64_t pf_next = 0;
  for (int32_t r0 = 0; r0 < T4; r0 += kQuadRows) {
    const int32_t nq = std::min(kQuadRows, T4 - r0) / 4;
    for (int32_t k0 = 0; k0 < K8; k0 += kQuadK) {
      const int32_t n = std::min(kQuadK, K8 - k0);
      for (int32_t t = 0; t < nt; ++t) {
        for (int64_t e = std::min(pf_lines, pf_next + pf_per_block); pf_next < e; ++pf_next)
          _mm_prefetch(pf + 64 * pf_next, _MM_HINT_T1);
        const float* w = wide + static_cast<int64_t>(3) * t * K + k0;
        for (int32_t q = 0; q < nq; ++q) {
          const float* xr = x + static_cast<int64_t>(r0 + 4 * q) * K + k0;
          float* acc = accs + (static_cast<size_t>(t) * (kQuadRows / 4) + q) * kTileAcc;
          if (k0 == 0) quad_block<true>(xr, w, K, n, acc);
          else quad_block<false>(xr, w, K, n, acc);
        }
      }
    }
    for (int32_t t = 0; t < nt; ++t)
      for (int32_t q = 0; q < nq; ++q) {
        const float* acc = accs + (static_cast<size_t>(t) * (kQuadRows / 4) + q) * kTileAcc;
        for (int r = 0; r < 4; ++r) {
          const int32_t row = r0 + 4 * q + r;
          const float* xr = x + static_cast<int64_t>(row) * K;
          for (int c = 0; c < 3; ++c) {
            const int32_t col = n0 + 3 * t + c;
            const float* wr = wide + static_cast<int64_t>(3 * t + c) * K;
            float v = K8 > 0 ? hsum(_mm256_loadu_ps(acc + (r * 3 + c) * 8)) : hsum(_mm256_setzero_ps());
            for (int32_t k = K8; k < K; ++k) v = fma1(xr[k], wr[k], v);
            if (bias != nullptr) v += bias[col];
            y[static_cast<int64_t>(row) * N + col] = v;
          }
        }
      }
  }
}

// Register budget (16 ymm): 4 rows × 3 columns = 12 accumulators + 3 weight
// vectors; a single row takes 8 columns (8 accumulators + 8 weight vectors).
// Rows [0, T4) of columns [n0, n1), T4 a multiple of 4. With 8+ rows the
// triplets go through quads_blocked (16-bit weights widened
// to f32 once, so the row quads share one conversion and the inner loop is
// loads and FMAs only); with one quad, column triplets outside, so a
// triplet's weight rows come from memory once and stay in L1, converted in
// registers. The last one or two columns take narrower tiles.
template <DType WT>
CK_AVX2 void quads(const float* x, int32_t T4, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                   int32_t n0, int32_t n1) {
  if (T4 == 0) return;
  int32_t c = n0;
  if (T4 >= 8) {
    const int32_t nt = (n1 - n0) / 3;
    if (nt > 0) quads_blocked<WT>(x, T4, K, W, N, bias, y, n0, nt);
    c = n0 + 3 * nt;
  } else {
    for (; c + 3 <= n1; c += 3) {
      // The quad prefetches the next triplet's rows.
      const void* next = c + 6 <= N ? weight_row<WT>(W, c + 3, K) : nullptr;
      tile<4, 3, WT>(x, K, weight_row<WT>(W, c, K), bias, y, N, 0, c, next);
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

// Rows that do not fill a 16-row block (see columns_row_pairs).
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

CK_AVX2 void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                            const float* bias, float* y, int32_t n0, int32_t n1) {
  switch (wt) {
    case DType::F32: columns<DType::F32>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::F16: columns<DType::F16>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::BF16: columns<DType::BF16>(x, T, K, W, N, bias, y, n0, n1); break;
    default: break;  // block formats: quant_dot.h
  }
}

CK_AVX512BW void matmul_columns_pairs(const float* x, const float* xp, int32_t T, int32_t K, const void* W, DType wt,
                                     int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  // Whole 16-row blocks on row pairs, the rest (and K < 8) on column pairs.
  const int32_t T16 = K >= 8 ? T - T % (2 * kPairRows) : 0;
  if (T16 > 0) {
    row_pairs(x, xp, T16, K, W, wt, N, bias, y, n0, n1);
  }
  if (T16 == T) return;
  const float* xr = x + static_cast<int64_t>(T16) * K;
  float* yr = y + static_cast<int64_t>(T16) * N;
  switch (wt) {
    case DType::F32: columns_pairs<DType::F32>(xr, T - T16, K, W, N, bias, yr, n0, n1); break;
    case DType::F16: columns_pairs<DType::F16>(xr, T - T16, K, W, N, bias, yr, n0, n1); break;
    case DType::BF16: columns_pairs<DType::BF16>(xr, T - T16, K, W, N, bias, yr, n0, n1); break;
    default: break;  // block formats: quant_dot.h
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
