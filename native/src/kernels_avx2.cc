// AVX2 + FMA + F16C (and AVX-512) GEMM and dense primitives. Every function
// carries its target attribute (simd_x86.h) instead of the file being
// compiled with -mavx2, so no vector code can leak into the baseline paths;
// these run only after cpu_features() has confirmed the CPU supports them.
#include "simd_x86.h"
#include "quant.h"

#ifdef CK_HAVE_AVX2_PATH

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace ck {
namespace avx2 {
namespace {

using simd::fma1;
using simd::hsum;
using simd::load_f16x8;

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
  return static_cast<const uint8_t*>(W) + row * bytes_of(WT, K);
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
  for (int32_t r0 = 0; r0 < T4; r0 += kQuadRows) {
    const int32_t nq = std::min(kQuadRows, T4 - r0) / 4;
    for (int32_t k0 = 0; k0 < K8; k0 += kQuadK) {
      const int32_t n = std::min(kQuadK, K8 - k0);
      for (int32_t t = 0; t < nt; ++t) {
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


// ---- 512-bit row pairs (Isa::Avx512, blocks of 16 rows) ------------------
// A block of 16 rows runs as 8 row pairs: the low half of accumulator
// (rp, j) is element (2rp, c + j), the high half element (2rp + 1, c + j).
// x is packed so one 512-bit load gives 8 k values of both rows of a pair,
// and each weight vector (8 k values of one column on both halves) feeds all
// 16 rows: per 8 k a tile does 8 x loads and C weight loads for 8·C FMAs,
// and 16-bit weights are widened in a register (one permute) instead of
// through a memory buffer. Each half still runs exactly the 8-lane FMA
// sequence of `tile` over k ascending, then the same horizontal sum and
// scalar tail: the same bits as every other path.
//
// K is walked in blocks of kKBlock: the packed x block (16 rows ·
// kKBlock · 4 B = 16 KiB) stays in L1 while every column tile of the work
// item reads it, and a tile's accumulators are saved between blocks (an exact
// store and reload). Unblocked, x (48 KiB at K = 768, 128 KiB at K = 2048)
// came from L2 once per column tile, and L2 bandwidth, not the FMA ports,
// bounded the loop.

#define CK_AVX512BW __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512bw")))

constexpr int kPairRows = 8;      // row pairs per tile: 16 rows
constexpr int kTileCols = 3;      // 24 accumulators + 3 weights + 1 x of 32 zmm
constexpr int32_t kKBlock = 256;  // a multiple of 32: whole 64-byte lines of 16-bit weights
constexpr int32_t kTileAcc = kPairRows * kTileCols * 16;  // floats of one tile's saved accumulators
// A tile prefetches the weights of the tile this many steps later: one tile
// runs ~800 cycles at K block 256, so two cover a DRAM miss with room to
// spare, and the lines in flight (2 · 3 rows · 8 lines) stay few.
constexpr int32_t kPrefetchTiles = 2;

// Rows [0, 16) of x (row stride K), k < K & ~7, in row-pair order:
// xp[(k / 8 · kPairRows + rp) · 16 + h · 8 + i] = x[(2rp + h) · K + k + i], so
// a k block [k0, k1) is the contiguous run from (k0 / 8) · 128 on.
CK_AVX512BW void pack_block(const float* x, int32_t K, float* xp) {
  const int32_t K8 = K & ~7;
  for (int32_t k = 0; k < K8; k += 8)
    for (int rp = 0; rp < kPairRows; ++rp) {
      const __m256 lo = _mm256_loadu_ps(x + static_cast<int64_t>(2 * rp) * K + k);
      const __m256 hi = _mm256_loadu_ps(x + static_cast<int64_t>(2 * rp + 1) * K + k);
      _mm512_storeu_ps(xp, _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
      xp += 16;
    }
}

// W[i .. i + 8) as f32 on both 256-bit halves.
template <DType WT>
CK_AVX512BW inline __m512 broadcast_w8(const void* W, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(static_cast<const float*>(W) + i));
  } else if constexpr (WT == DType::F16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const f16*>(W) + i));
    return _mm512_cvtph_ps(_mm256_broadcastsi128_si256(h));
  } else {
    // Word 2j + 1 takes bf16 value j % 8 and word 2j is zero, so dword j is
    // bf16[j % 8] << 16: the exact f32.
    const __m512i idx = _mm512_set_epi16(7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0,  //
                                         7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const bf16*>(W) + i));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, _mm512_castsi128_si512(h)));
  }
}

// Columns [c, c + C) of a 16-row block over k in [k0, k1): accumulators
// start at zero (kFirst: the first block) or from `acc_mem`, and are saved
// back to `acc_mem`.
// pf (or nullptr) points at kTileCols weight rows (stride K) that a later
// tile reads from: one cache line per row is prefetched every 32 k.
template <int C, DType WT, bool kFirst>
CK_AVX512BW void row_pair_tile(const float* xp, int32_t k0, int32_t k1, const void* Wc, int32_t K, float* acc_mem,
                               const void* pf) {
  const char* pfb = static_cast<const char*>(pf);
  const int64_t row_bytes = static_cast<int64_t>(K) * dtype_bytes(WT);
  __m512 acc[kPairRows][C];
  for (int rp = 0; rp < kPairRows; ++rp)
    for (int j = 0; j < C; ++j)
      acc[rp][j] = kFirst ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_mem + (rp * kTileCols + j) * 16);
  // k1 > k0 (a do-while: with a zero-trip path the compiler moves every
  // accumulator through the stack).
  int32_t k = k0;
  do {
    if (pfb != nullptr && (k - k0) % 32 == 0)
      for (int j = 0; j < kTileCols; ++j) _mm_prefetch(pfb + j * row_bytes + (k - k0) * dtype_bytes(WT), _MM_HINT_T0);
    __m512 w[C];
    for (int j = 0; j < C; ++j) w[j] = broadcast_w8<WT>(Wc, static_cast<int64_t>(j) * K + k);
    const float* xs = xp + static_cast<int64_t>(k - k0) * 2 * kPairRows;
    for (int rp = 0; rp < kPairRows; ++rp) {
      __m512 xv = _mm512_loadu_ps(xs + rp * 16);
      // Keeps xv in a register: folded into each FMA, the one load would
      // become C loads and the loop load-port bound.
      __asm__("" : "+v"(xv));
      for (int j = 0; j < C; ++j) acc[rp][j] = _mm512_fmadd_ps(xv, w[j], acc[rp][j]);
    }
    k += 8;
  } while (k < k1);
  for (int rp = 0; rp < kPairRows; ++rp)
    for (int j = 0; j < C; ++j) _mm512_storeu_ps(acc_mem + (rp * kTileCols + j) * 16, acc[rp][j]);
}

// y for rows [0, 16) × columns [c, c + C) from a tile's final accumulators:
// hsum of each half, then the scalar tail k >= K & ~7, then the bias.
template <int C, DType WT>
CK_AVX512BW void finish_row_pairs(const float* acc_mem, const float* x, int32_t K, const void* Wc, const float* bias,
                                  float* y, int32_t N, int32_t c) {
  const int32_t K8 = K & ~7;
  if (C == 3 && K8 == K) {
    // Three columns of a row pair at once, in the order of hsum:
    //   Z = (lanes 0-3) + (lanes 4-7) of each half, two accumulators per
    //   vector; V = Z[0,1] + Z[2,3] of each 4-lane block; R = V[0] + V[1].
    // Block b lane 0 of R is accumulator 0 (b = 0, 1) or 1 (b = 2, 3), half
    // b % 2; block b lane 2 is accumulator 2, half b (b = 0, 1).
    const __m512i row_lo = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 8, 0);
    const __m512i row_hi = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 12, 4);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(0x7, bias + c) : _mm512_setzero_ps();
    for (int rp = 0; rp < kPairRows; ++rp) {
      const float* a = acc_mem + rp * kTileCols * 16;
      const __m512 a0 = _mm512_loadu_ps(a), a1 = _mm512_loadu_ps(a + 16), a2 = _mm512_loadu_ps(a + 32);
      const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x88), _mm512_shuffle_f32x4(a0, a1, 0xDD));
      const __m512 z2 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a2, 0x88), _mm512_shuffle_f32x4(a2, a2, 0xDD));
      const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(z01, z2, 0x44), _mm512_shuffle_ps(z01, z2, 0xEE));
      const __m512 r = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
      float* y0 = y + static_cast<int64_t>(2 * rp) * N + c;
      _mm512_mask_storeu_ps(y0, 0x7, _mm512_add_ps(_mm512_permutexvar_ps(row_lo, r), b));
      _mm512_mask_storeu_ps(y0 + N, 0x7, _mm512_add_ps(_mm512_permutexvar_ps(row_hi, r), b));
    }
    return;
  }
  for (int rp = 0; rp < kPairRows; ++rp)
    for (int h = 0; h < 2; ++h) {
      const float* xr = x + static_cast<int64_t>(2 * rp + h) * K;
      for (int j = 0; j < C; ++j) {
        const int64_t wrow = static_cast<int64_t>(j) * K;
        float s = hsum(_mm256_loadu_ps(acc_mem + (rp * kTileCols + j) * 16 + h * 8));
        for (int32_t k = K8; k < K; ++k) s = fma1(xr[k], load_w1<WT>(Wc, wrow + k), s);
        if (bias != nullptr) s += bias[c + j];
        y[static_cast<int64_t>(2 * rp + h) * N + c + j] = s;
      }
    }
}

thread_local std::vector<float> tl_tile_acc;  // [column tiles, kTileAcc]

// Rows [0, T16) (a multiple of 16, K >= 8) of columns [n0, n1); xp is x
// packed by pack_rows.
template <DType WT>
CK_AVX512BW void columns_row_pairs(const float* x, const float* xp, int32_t T16, int32_t K, const void* W,
                                   int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  const int32_t K8 = K & ~7;
  const int32_t tiles = (n1 - n0 + kTileCols - 1) / kTileCols;
  float* accs = aligned_floats(tl_tile_acc, static_cast<size_t>(tiles) * kTileAcc);
  for (int32_t r0 = 0; r0 < T16; r0 += 2 * kPairRows) {
    const float* xb = x + static_cast<int64_t>(r0) * K;
    const float* xpb = xp + static_cast<int64_t>(r0) * K8;
    float* yb = y + static_cast<int64_t>(r0) * N;
    // The tiles before the first prefetching one: their first block now
    // (the previous work item's prefetch past its n1 went to whichever item
    // comes next in column order, usually the other thread's).
    if (r0 == 0) {
      const int64_t bytes = static_cast<int64_t>(std::min(K8, kKBlock)) * dtype_bytes(WT);
      for (int32_t c = n0; c < std::min(n1, n0 + kPrefetchTiles * kTileCols); ++c) {
        const char* row = static_cast<const char*>(weight_row<WT>(W, c, K));
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
      }
    }
    for (int32_t k0 = 0; k0 < K8; k0 += kKBlock) {
      const int32_t k1 = std::min(K8, k0 + kKBlock);
      for (int32_t t = 0; t < tiles; ++t) {
        const int32_t c = n0 + t * kTileCols;
        const void* Wc = weight_row<WT>(W, c, K);
        // The weights kPrefetchTiles tiles later in this (block, tile)
        // order, or past the last block the first block of the columns after
        // n1 (usually the next work item of this or the other thread).
        const int32_t ahead = (k0 / kKBlock) * tiles + t + kPrefetchTiles;
        int32_t pc = n0 + (ahead % tiles) * kTileCols;
        int32_t pk = (ahead / tiles) * kKBlock;
        if (pk >= K8) {
          pc = n1 + (ahead - (K8 + kKBlock - 1) / kKBlock * tiles) * kTileCols;
          pk = 0;
        }
        // Later row blocks find the item's weights in L2.
        const void* pf = nullptr;
        if (r0 == 0 && pc + kTileCols <= N)
          pf = static_cast<const uint8_t*>(weight_row<WT>(W, pc, K)) + static_cast<int64_t>(pk) * dtype_bytes(WT);
        float* acc = accs + static_cast<size_t>(t) * kTileAcc;
        const float* xk = xpb + static_cast<int64_t>(k0) * 2 * kPairRows;
        const int32_t C = std::min(kTileCols, n1 - c);
        if (k0 == 0) {
          switch (C) {
            case 3: row_pair_tile<3, WT, true>(xk, k0, k1, Wc, K, acc, pf); break;
            case 2: row_pair_tile<2, WT, true>(xk, k0, k1, Wc, K, acc, pf); break;
            default: row_pair_tile<1, WT, true>(xk, k0, k1, Wc, K, acc, pf); break;
          }
        } else {
          switch (C) {
            case 3: row_pair_tile<3, WT, false>(xk, k0, k1, Wc, K, acc, pf); break;
            case 2: row_pair_tile<2, WT, false>(xk, k0, k1, Wc, K, acc, pf); break;
            default: row_pair_tile<1, WT, false>(xk, k0, k1, Wc, K, acc, pf); break;
          }
        }
      }
    }
    for (int32_t t = 0; t < tiles; ++t) {
      const int32_t c = n0 + t * kTileCols;
      const void* Wc = weight_row<WT>(W, c, K);
      const float* acc = accs + static_cast<size_t>(t) * kTileAcc;
      switch (std::min(kTileCols, n1 - c)) {
        case 3: finish_row_pairs<3, WT>(acc, xb, K, Wc, bias, yb, N, c); break;
        case 2: finish_row_pairs<2, WT>(acc, xb, K, Wc, bias, yb, N, c); break;
        default: finish_row_pairs<1, WT>(acc, xb, K, Wc, bias, yb, N, c); break;
      }
    }
  }
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

CK_AVX2 double sum_squares(const float* x, int32_t n) {
  // Lanes 0-3 and 4-7 of the 8 partial sums; x² is exact in f64, so the FMA
  // rounds exactly like the portable square-then-add.
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
  // (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then (s0 + s2) + (s1 + s3).
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  for (int32_t i = n8; i < n; ++i) r += static_cast<double>(x[i]) * x[i];
  return r;
}

// exp(v) as generic::expf_poly computes it, 8 lanes at once (every step an
// IEEE operation of the same operands in the same order).
CK_AVX2 inline __m256 exp8(__m256 v) {
  v = _mm256_min_ps(v, _mm256_set1_ps(kExpHi));
  v = _mm256_max_ps(v, _mm256_set1_ps(kExpLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), v);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

CK_AVX2 void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));  // -g, as the scalar negation
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (int64_t i = n8; i < n; ++i) out[i] = generic::silu(gate[i]) * up[i];
}

// generic::gelu_tanh lane by lane: the same IEEE operations in the same order.
CK_AVX2 void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 cubic = _mm256_set1_ps(kGeluCubic);
  const __m256 k = _mm256_set1_ps(kGeluMinus2Sqrt2OverPi);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_fmadd_ps(cubic, g3, g), k));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (int64_t i = n8; i < n; ++i) out[i] = generic::gelu_tanh(gate[i]) * up[i];
}

CK_AVX2 void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                            const float* bias, float* y, int32_t n0, int32_t n1) {
  switch (wt) {
    case DType::F32: columns<DType::F32>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::F16: columns<DType::F16>(x, T, K, W, N, bias, y, n0, n1); break;
    case DType::BF16: columns<DType::BF16>(x, T, K, W, N, bias, y, n0, n1); break;
    default: break;  // block formats: quant_dot.h
  }
}

int64_t packed_rows_floats(int32_t T, int32_t K) {
  return K >= 8 ? static_cast<int64_t>(T - T % (2 * kPairRows)) * (K & ~7) : 0;
}

CK_AVX512BW void pack_rows(const float* x, int32_t T, int32_t K, float* xp) {
  const int32_t T16 = K >= 8 ? T - T % (2 * kPairRows) : 0;
  for (int32_t r0 = 0; r0 < T16; r0 += 2 * kPairRows)
    pack_block(x + static_cast<int64_t>(r0) * K, K, xp + static_cast<int64_t>(r0) * (K & ~7));
}

CK_AVX512BW void matmul_columns_pairs(const float* x, const float* xp, int32_t T, int32_t K, const void* W, DType wt,
                                     int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  // Whole 16-row blocks on row pairs, the rest (and K < 8) on column pairs.
  const int32_t T16 = K >= 8 ? T - T % (2 * kPairRows) : 0;
  if (T16 > 0) {
    switch (wt) {
      case DType::F32: columns_row_pairs<DType::F32>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
      case DType::F16: columns_row_pairs<DType::F16>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
      case DType::BF16: columns_row_pairs<DType::BF16>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
      default: break;  // block formats: quant_dot.h
    }
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

CK_AVX2 double exp_sum(const float* x, int32_t n, float m) {
  // Lanes 0-3 and 4-7 of the 8 partial sums, each adding its f32 term
  // widened to f64, as the portable loop does.
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const __m256 mv = _mm256_set1_ps(m);
  const __m256 lim = _mm256_set1_ps(kExpLo);
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(d, lim, _CMP_LT_OQ), exp8(d));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  for (int32_t i = n8; i < n; ++i) {
    const float d = x[i] - m;
    r += d < kExpLo ? 0.0f : generic::expf_poly(d);
  }
  return r;
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
