// AVX-512 row-pair GEMM tiles (Isa::Avx512, batches of 16+ rows) and the
// packing of x they read; the same target-attribute discipline (simd_x86.h).
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

int64_t packed_rows_floats(int32_t T, int32_t K) {
  return K >= 8 ? static_cast<int64_t>(T - T % (2 * kPairRows)) * (K & ~7) : 0;
}

CK_AVX512BW void pack_rows(const float* x, int32_t T, int32_t K, float* xp) {
  const int32_t T16 = K >= 8 ? T - T % (2 * kPairRows) : 0;
  for (int32_t r0 = 0; r0 < T16; r0 += 2 * kPairRows)
    pack_block(x + static_cast<int64_t>(r0) * K, K, xp + static_cast<int64_t>(r0) * (K & ~7));
}

CK_AVX512BW void row_pairs(const float* x, const float* xp, int32_t T16, int32_t K, const void* W, DType wt,
                          int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  switch (wt) {
    case DType::F32: columns_row_pairs<DType::F32>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
    case DType::F16: columns_row_pairs<DType::F16>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
    case DType::BF16: columns_row_pairs<DType::BF16>(x, xp, T16, K, W, N, bias, y, n0, n1); break;
    default: break;  // block formats: quant_dot.h
  }
}

}  // namespace avx2
}  // namespace ck

#endif  // CK_HAVE_AVX2_PATH
