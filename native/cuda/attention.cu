// Split-KV ("flash-decoding") attention over paged or contiguous f16 K/V, for
// a ragged batch of decode and prefill rows. See kernels_cuda.cuh for the
// contract; the math per (row t, query head h), over the row's keys
// j = lo_t..pos_t (lo_t = 0, or max(0, pos_t - window + 1) on a sliding layer):
//   s_j   = scale * q[t,h,:]·k[j,kvh,:]
//   s_j   = softcap * tanh(s_j / softcap)                 (softcap > 0 only)
//   split s covers keys [max(s*S, lo_t), min((s+1)*S, pos_t+1)), S = kAttnSplitKeys;
//   splits wholly below lo_t are skipped
//   m_s = max_j s_j,  l_s = sum_j e^(s_j - m_s),  a_s = sum_j e^(s_j - m_s) v_j
//   M = max_s m_s,  out = (sum_s a_s e^(m_s-M)) / (sum_s l_s e^(m_s-M))
//
// Pass 1 runs both products on the tensor cores (mma.sync m16n8k16, f16 in,
// f32 accumulate): K and V are f16 already, and the f32 operands (q, and the
// probabilities p) are split into two f16 halves, x = hi + lo with
// hi = f16(x), lo = f16(x - hi), which carries 22 of f32's 24 significand
// bits. The 8 columns of the mma hold hi and lo of 4 query heads side by
// side (column 2g = hi of head g, 2g + 1 = lo), so score_g = C[2g] + C[2g+1]
// in the same lane. q is first scaled by a power of two per head (exact) so
// that its largest element lies in [2^14, 2^15): no f16 overflow, and small
// elements keep their bits; the score is scaled back by the same power.
//
// The kernel is bound by streaming K and V (decode: every byte is read once),
// so what matters is bytes in flight: K/V go from 16-byte loads straight into
// mma fragments (no shared memory, no conversion), 4 blocks of 4 warps per SM,
// splits of 512 keys (8 tiles a warp, so a block's start-up and merge are
// paid once per 256 KB of K/V at head_dim 128), the first tile's loads issued
// before q is set up, the next tile's page lookup before the current tile's
// math, no register spills; loads skip L1 and ask L2 for 256-byte
// fills (each 256-byte K or V row of a head is read whole). Blocks of the
// same (row, split) for neighbouring kv heads run next to each other (kv head
// is the fastest grid index), so a key's K row of all heads (n_kv * 256 bytes,
// contiguous) is fetched at about the same time. Pass 2 (the split combine)
// is launched with programmatic dependent launch, so its blocks are resident
// and waiting when pass 1 ends.
//
// Every sum runs in a fixed order (mma k-steps in increasing dims, tiles of
// a warp in increasing keys, warps merged 0,1,2,3, splits added in increasing
// s), and the split bounds are absolute key positions, so a row's bits depend
// only on its own q, keys and values: not on the batch, the chunking or the
// addressing (paged and contiguous run the same code).
#include <cuda_fp16.h>

#include <cmath>

#include "kernels_cuda.cuh"

namespace ck::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kSplit = kAttnSplitKeys;
constexpr int kTile = 16;         // keys per warp step: the mma's M for q·K, its K for p·V
constexpr int kPassHeads = 4;     // query heads per block: hi and lo of 4 heads fill the mma's 8 columns
constexpr int32_t kMaxSplits = 4096;  // pass 2 keeps 2 floats per split in shared memory (32 KB)
constexpr int32_t kMaxKeys = kMaxSplits * kSplit;
constexpr int64_t kPastEnd = -2;  // key beyond the split: score -inf, p = 0
constexpr int64_t kBadPage = -1;  // page table points outside the pool: score NaN, output NaN
constexpr unsigned kFull = 0xffffffffu;

// Key position j of a row -> index of its K/V row in the [rows, n_kv, dim]
// view of the cache, or kBadPage when the page table points outside the pool.
struct PagedAddr {
  const int32_t* page_table;
  int32_t pt_stride, page_size;
  int64_t num_pages;
  __device__ int64_t row(int32_t seq, int32_t j) const {
    const int32_t pi = j / page_size;
    if (pi >= pt_stride) return kBadPage;
    const int64_t page = page_table[int64_t{seq} * pt_stride + pi];
    if (page < 0 || page >= num_pages) return kBadPage;
    return page * page_size + (j - pi * page_size);
  }
  __device__ bool fits(int32_t n_keys) const { return n_keys <= int64_t{pt_stride} * page_size; }
};

struct ContiguousAddr {
  int32_t ctx_cap;
  __device__ int64_t row(int32_t seq, int32_t j) const { return int64_t{seq} * ctx_cap + j; }
  __device__ bool fits(int32_t n_keys) const { return n_keys <= ctx_cap; }
};

struct AttnArgs {
  const float* q;  // [T, n_heads, HD]
  const f16* k;    // [rows, n_kv, HD]
  const f16* v;    // [rows, n_kv, VHD]
  const int32_t* row_seq;
  const int32_t* row_pos;
  float* out;  // [T, n_heads, VHD]
  float* ws;   // [T, n_heads, n_splits, VHD + 2]
  int32_t T, n_heads, n_kv, group, n_splits;
  float scale;
  int32_t window;  // 0: every key 0..pos; W: keys pos - W + 1 .. pos
  float softcap;   // 0: none
};

// First key a row at `pos` attends (kernels.h).
__device__ __forceinline__ int32_t first_key(int32_t pos, int32_t window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// D += A·B, m16n8k16, A row-major 16x16 f16, B column-major 16x8 f16, f32
// accumulators (PTX ISA fragment layouts: lane = 4 g + t holds A rows g and
// g + 8, columns 2t, 2t+1 and 2t+8, 2t+9; B columns g, rows 2t, 2t+1 and
// 2t+8, 2t+9; C rows g and g + 8, columns 2t, 2t+1).
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// f16(x), or with lo the residual f16(x - f16(x)).
__device__ __forceinline__ __half f16_part(float x, bool lo) {
  const __half hi = __float2half_rn(x);
  return lo ? __float2half_rn(x - __half2float(hi)) : hi;
}

// The f16 pair (x, y), x in the low half: hi parts, or with lo the residuals.
__device__ __forceinline__ uint32_t f16_pair(float x, float y, bool lo) {
  return static_cast<uint32_t>(__half_as_ushort(f16_part(x, lo))) |
         (static_cast<uint32_t>(__half_as_ushort(f16_part(y, lo))) << 16);
}

__device__ __forceinline__ uint32_t word(const uint4& u, int e) {
  return e == 0 ? u.x : e == 1 ? u.y : e == 2 ? u.z : u.w;
}

__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // e in [-126, 127]

// N 16-byte chunks of cache row `row` (halves off, off + STEP, ...), or zeros
// for a key with no row (past the split or a bad page). Streamed: not kept in
// L1, L2 filled 256 bytes at a time.
template <int N, int STEP>
__device__ __forceinline__ void load_chunks(const f16* base, int64_t row, int64_t row_stride, int off,
                                            uint4 (&out)[N]) {
  if (row >= 0) {
    const f16* p = base + row * row_stride + off;
#pragma unroll
    for (int i = 0; i < N; ++i)
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(out[i].x), "=r"(out[i].y), "=r"(out[i].z), "=r"(out[i].w)
                   : "l"(p + STEP * i));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// One warp's 16-key tile in registers. Lane = 4 r + c holds K of keys r and
// r + 8 at dims 32 i + 8 c .. + 7 (i < HD/32), and V of keys 2c, 2c+1, 2c+8,
// 2c+9 at dims 64 j + 8 r .. + 7 (j < HD/64).
template <int HD>
struct Tile {
  float mask0, mask8;  // keys r, r + 8: 0 (a key), -inf (past the split) or NaN (bad page)
  uint4 k0[HD / 32], k8[HD / 32], v[4][HD / 64];
};

// Lane l's key (l & 15) of `tile` -> its cache row.
template <class Addr>
__device__ __forceinline__ int64_t tile_row(int32_t tile, int32_t nk, int32_t seq, int32_t j0, const Addr& addr,
                                            int lane) {
  const int32_t kk = tile * kTile + (lane & 15);
  return kk < nk ? addr.row(seq, j0 + kk) : kPastEnd;
}

// Added to a key's score: 0 for a key, -inf past the split (p = 0), NaN for
// a bad page (NaN propagates to the output).
__device__ __forceinline__ float row_mask(int64_t row) {
  return row >= 0 ? 0.0f : row == kBadPage ? __int_as_float(0x7fc00000) : -INFINITY;
}

// my_row: this lane's tile_row; the lanes that need a key's row shuffle it.
template <int HD>
__device__ __forceinline__ void load_k(Tile<HD>& tl, int64_t my_row, const f16* kbase, int64_t row_stride, int r,
                                       int c) {
  const int64_t row_k0 = __shfl_sync(kFull, my_row, r), row_k8 = __shfl_sync(kFull, my_row, r + 8);
  load_chunks<HD / 32, 32>(kbase, row_k0, row_stride, 8 * c, tl.k0);
  load_chunks<HD / 32, 32>(kbase, row_k8, row_stride, 8 * c, tl.k8);
  tl.mask0 = row_mask(row_k0);
  tl.mask8 = row_mask(row_k8);
}

template <int HD>
__device__ __forceinline__ void load_v(Tile<HD>& tl, int64_t my_row, const f16* vbase, int64_t row_stride, int r,
                                       int c) {
  const int64_t row_v[4] = {__shfl_sync(kFull, my_row, 2 * c), __shfl_sync(kFull, my_row, 2 * c + 1),
                            __shfl_sync(kFull, my_row, 2 * c + 8), __shfl_sync(kFull, my_row, 2 * c + 9)};
#pragma unroll
  for (int u = 0; u < 4; ++u) load_chunks<HD / 64, 64>(vbase, row_v[u], row_stride, 8 * r, tl.v[u]);
}

// Scores of keys r and r + 8 for head c (this lane's head in every C layout):
// two mma chains (even and odd 16-dim steps). q's B fragments come from
// shared memory (4 16-byte reads at HD 128) rather than registers, which keeps
// the kernel at 128 registers (4 blocks an SM). qf points at this lane's
// column (hi or lo of head r/2) at dim 8 c; k-step 2 i + h uses dims
// 32 i + 8 c + 4 h .. + 3.
template <int HD>
__device__ __forceinline__ void tile_scores(const Tile<HD>& tl, const __half* qf, float sc, float cap, float& s0,
                                            float& s1) {
  float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) {
    const uint4 q = *reinterpret_cast<const uint4*>(qf + 32 * i);
    mma_16816(sa, word(tl.k0[i], 0), word(tl.k8[i], 0), word(tl.k0[i], 1), word(tl.k8[i], 1), q.x, q.y);
    mma_16816(sb, word(tl.k0[i], 2), word(tl.k8[i], 2), word(tl.k0[i], 3), word(tl.k8[i], 3), q.z, q.w);
  }
  float v0 = ((sa[0] + sb[0]) + (sa[1] + sb[1])) * sc;
  float v1 = ((sa[2] + sb[2]) + (sa[3] + sb[3])) * sc;
  if (cap > 0.0f) {  // a key with no row has v = 0 (zero K), so its mask still decides
    v0 = cap * tanhf(v0 / cap);
    v1 = cap * tanhf(v1 / cap);
  }
  s0 = v0 + tl.mask0;
  s1 = v1 + tl.mask8;
}

// The online softmax step for head c and acc += V^T p. acc rows = dims
// 64 j + 8 r + 2 e and + 1 of m-tile 4 j + e; columns = hi, lo of head c.
template <int HD>
__device__ __forceinline__ void tile_values(const Tile<HD>& tl, float s0, float s1, int r, int c, bool lo_col,
                                            float& m_run, float& l_run, float (&acc)[HD / 16][4]) {
  // ---- the tile max over the 8 lanes of head c
  float tm = fmaxf(s0, s1);
  tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 4));
  tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 8));
  tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 16));
  const float m_new = fmaxf(m_run, tm);
  const float alpha = expf(m_run - m_new);                   // a tile of only bad keys: NaN, which propagates
  const float p0 = expf(s0 - m_new), p1 = expf(s1 - m_new);  // NaN score (bad page) -> NaN
  l_run = l_run * alpha + p0 + p1;
  m_run = m_new;
#pragma unroll
  for (int i = 0; i < HD / 16; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[i][u] *= alpha;

  // ---- p as B fragments: column r = hi/lo of head r/2 at keys 2c, 2c+1 (b0)
  // and 2c+8, 2c+9 (b1); p of head h at key k < 8 is p0 of lane 4 k + h, at
  // key k + 8 its p1.
  const int src = 8 * c + (r >> 1);
  const float pa0 = __shfl_sync(kFull, p0, src), pb0 = __shfl_sync(kFull, p0, src + 4);
  const float pa1 = __shfl_sync(kFull, p1, src), pb1 = __shfl_sync(kFull, p1, src + 4);
  const uint32_t pf0 = f16_pair(pa0, pb0, lo_col), pf1 = f16_pair(pa1, pb1, lo_col);

  // ---- acc += V^T p; A rows r / r + 8 = dims 64 j + 8 r + 2 e / + 1, columns =
  // keys 2c, 2c+1 | 2c+8, 2c+9: byte permutes pair the keys' halves.
#pragma unroll
  for (int j = 0; j < HD / 64; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t w0 = word(tl.v[0][j], e), w1 = word(tl.v[1][j], e), w2 = word(tl.v[2][j], e),
                     w3 = word(tl.v[3][j], e);
      mma_16816(acc[4 * j + e], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                __byte_perm(w2, w3, 0x5410), __byte_perm(w2, w3, 0x7632), pf0, pf1);
    }
}

template <int HD>
constexpr int partial_blocks_per_sm() {
  return HD <= 128 ? 4 : 2;  // 128 / 255 registers a thread
}

// Pass 1. Block = (kv head and pass of 4 query heads, split s, row t); 4
// warps; warp w takes the split's 16-key tiles w, w+4, w+8, ... with an
// online softmax, then the warps are merged in order 0..3. Lane = 4 r + c:
//  - q·K: A = the tile's K (rows = keys r, r+8; each lane loads 16-byte runs
//    of dims 32 i + 8 c .. + 7 of both keys and uses them as its A columns, the
//    same dims as its B = q fragment), C = scores of keys r, r+8 for head c.
//  - p·V: A = V^T (rows = dims, columns = keys 2c, 2c+1, 2c+8, 2c+9; each lane
//    loads 16-byte runs of dims 64 j + 8 r .. + 7 of its 4 keys and pairs keys
//    with byte permutes), B = p (shuffled from the score lanes), C = the
//    output of head c at dims 64 j + 8 r + 2 e (+1), e = 0..3.
// So lane c owns head c throughout: its running max, sum and accumulator.
template <int HD, class Addr>
__global__ void __launch_bounds__(kThreads, partial_blocks_per_sm<HD>()) attn_partial_kernel(AttnArgs a, Addr addr) {
  constexpr int MTILES = HD / 16;
  __shared__ __align__(16) __half q_sh[2][kPassHeads][HD];  // q * 2^-shift: hi, lo
  __shared__ int qmax_sh[kPassHeads];                       // bits of max |q| per head
  __shared__ float acc_sh[kWarps][kPassHeads][HD];
  __shared__ float m_sh[kWarps][kPassHeads], l_sh[kWarps][kPassHeads];

  // Let pass 2 launch now: its blocks wait (griddepcontrol.wait) for this
  // whole grid to finish and its writes to be visible.
  asm volatile("griddepcontrol.launch_dependents;");
  const int32_t passes = (a.group + kPassHeads - 1) / kPassHeads;
  const int32_t kvh = static_cast<int32_t>(blockIdx.x) / passes;
  const int32_t g0 = (static_cast<int32_t>(blockIdx.x) % passes) * kPassHeads;  // first group head of this pass
  const int32_t heads = min(kPassHeads, a.group - g0);
  const int32_t s = blockIdx.y, t = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int32_t pos = a.row_pos[t];
  const int32_t n_keys = pos + 1;
  // Split s's keys: [j0, j0 + nk), within [s * kSplit, (s + 1) * kSplit) and the row's window.
  const int32_t j0 = max(s * kSplit, first_key(pos, a.window));
  // Split unused: past the row's keys, or wholly before its window (combine reads only used splits).
  if (pos < 0 || j0 >= n_keys || j0 >= (s + 1) * kSplit || !addr.fits(n_keys)) return;
  const int32_t nk = min((s + 1) * kSplit, n_keys) - j0;
  const int32_t seq = a.row_seq[t];
  const int64_t row_stride = int64_t{a.n_kv} * HD;  // halves between consecutive cache rows (K and V)
  const f16* kbase = a.k + int64_t{kvh} * HD;
  const f16* vbase = a.v + int64_t{kvh} * HD;

  // The first tile's loads go out before q is read.
  const int32_t n_tiles = (nk + kTile - 1) / kTile;
  int32_t tile = warp;
  Tile<HD> cur;
  if (tile < n_tiles) {
    const int64_t row = tile_row(tile, nk, seq, j0, addr, lane);
    load_k<HD>(cur, row, kbase, row_stride, r, c);
    load_v<HD>(cur, row, vbase, row_stride, r, c);
  }

  // ---- q of the pass's heads, scaled per head by 2^-shift, split into hi/lo
  if (threadIdx.x < kPassHeads) qmax_sh[threadIdx.x] = 0;
  __syncthreads();
  const float* qrow = a.q + (int64_t{t} * a.n_heads + int64_t{kvh} * a.group + g0) * HD;
  constexpr int QV = (kPassHeads * HD + 4 * kThreads - 1) / (4 * kThreads);  // float4s of q a thread
  float4 qv[QV];
#pragma unroll
  for (int u = 0; u < QV; ++u) {
    const int e4 = min((threadIdx.x + u * kThreads) * 4, kPassHeads * HD - 4), hh = e4 / HD;  // HD 64: 2 threads, 1 float4
    qv[u] = hh < heads ? *reinterpret_cast<const float4*>(qrow + e4) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float mx = fmaxf(fmaxf(fabsf(qv[u].x), fabsf(qv[u].y)), fmaxf(fabsf(qv[u].z), fabsf(qv[u].w)));
    atomicMax(&qmax_sh[hh], __float_as_int(mx));  // non-negative floats order as their bits; exact
  }
  __syncthreads();
  // ilogb: 0 -> very negative, inf/NaN -> very positive; clamped so both
  // 2^-shift and scale * 2^shift stay normal floats. max |q| 2^-shift in [2^14, 2^15).
  auto shift_of = [&](int hh) {
    const float mx = __int_as_float(qmax_sh[hh]);
    return (mx > 0.0f ? min(max(ilogbf(mx), -100), 100) : -100) - 14;
  };
#pragma unroll
  for (int u = 0; u < QV; ++u) {
    const int e4 = min((threadIdx.x + u * kThreads) * 4, kPassHeads * HD - 4), hh = e4 / HD, d = e4 % HD;
    const float down = pow2(-shift_of(hh));
    const float x[4] = {qv[u].x * down, qv[u].y * down, qv[u].z * down, qv[u].w * down};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q_sh[0][hh][d + i] = f16_part(x[i], false);
      q_sh[1][hh][d + i] = f16_part(x[i], true);
    }
  }
  __syncthreads();
  // B fragments: column r = hi (r even) or lo (r odd) of head r/2.
  const bool lo_col = (r & 1) != 0;
  const __half* qf = &q_sh[lo_col ? 1 : 0][r >> 1][8 * c];
  const float sc = a.scale * pow2(shift_of(c));  // head c's scores

  float m_run = -INFINITY, l_run = 0.0f;
  float acc[MTILES][4];
#pragma unroll
  for (int i = 0; i < MTILES; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[i][u] = 0.0f;
  // The next tile's page lookup is issued before this tile's math, its loads
  // right after. (Issuing the next K loads between q·K and p·V keeps two
  // tiles' worth of registers live, spills at 128 registers, and measured
  // 4% slower on H200.)
  while (tile < n_tiles) {
    const int32_t next = tile + kWarps;
    const int64_t next_row = next < n_tiles ? tile_row(next, nk, seq, j0, addr, lane) : kPastEnd;
    float s0, s1;
    tile_scores<HD>(cur, qf, sc, a.softcap, s0, s1);
    tile_values<HD>(cur, s0, s1, r, c, lo_col, m_run, l_run, acc);
    if (next < n_tiles) {
      load_k<HD>(cur, next_row, kbase, row_stride, r, c);
      load_v<HD>(cur, next_row, vbase, row_stride, r, c);
    }
    tile = next;
  }

  // ---- merge the warps in order 0..3 -------------------------------------------
  l_run += __shfl_xor_sync(kFull, l_run, 4);
  l_run += __shfl_xor_sync(kFull, l_run, 8);
  l_run += __shfl_xor_sync(kFull, l_run, 16);
  if (c < heads) {
#pragma unroll
    for (int j = 0; j < HD / 64; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 64 * j + 8 * r + 2 * e;
        acc_sh[warp][c][d] = acc[4 * j + e][0] + acc[4 * j + e][1];
        acc_sh[warp][c][d + 1] = acc[4 * j + e][2] + acc[4 * j + e][3];
      }
    if (r == 0) {
      m_sh[warp][c] = m_run;
      l_sh[warp][c] = l_run;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < heads * HD; idx += kThreads) {
    const int hh = idx / HD, d = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_sh[w][hh]);
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = expf(m_sh[w][hh] - M);  // a warp without keys: m = -inf, f = 0, l = acc = 0
      L = fmaf(l_sh[w][hh], f, L);
      A = fmaf(acc_sh[w][hh][d], f, A);
    }
    const int64_t h = int64_t{kvh} * a.group + g0 + hh;
    float* rec = a.ws + ((int64_t{t} * a.n_heads + h) * a.n_splits + s) * (HD + 2);
    rec[d] = A;
    if (d == 0) {
      rec[HD] = M;
      rec[HD + 1] = L;
    }
  }
}

// Pass 2. Block = (head h, row t); thread d owns output dim d. The block
// loads the used splits' m and l once into shared memory (w_s = e^(m_s - M)),
// while each thread already has the first kPrefetch splits' values of its dim
// in flight; then out = (sum_s acc_s[d] w_s) / (sum_s l_s w_s), s increasing.
constexpr int kPrefetch = 16;

template <int VHD, class Addr>
__global__ void __launch_bounds__(VHD) attn_combine_kernel(AttnArgs a, Addr addr) {
  extern __shared__ float split_sh[];  // w[n_splits], l[n_splits]
  __shared__ float max_sh[VHD / 32];
  asm volatile("griddepcontrol.wait;" ::: "memory");  // pass 1 finished, its writes visible
  const int32_t h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
  float* o = a.out + (int64_t{t} * a.n_heads + h) * VHD + d;
  const int32_t pos = a.row_pos[t];
  const int32_t n_used = pos >= 0 ? pos / kSplit + 1 : 0;  // splits s0 .. n_used - 1 hold the row's keys
  if (pos < 0 || n_used > a.n_splits || !addr.fits(pos + 1)) {
    *o = __int_as_float(0x7fc00000);  // row beyond max_keys / the cache: visible, not truncated
    return;
  }
  const int32_t s0 = first_key(pos, a.window) / kSplit;
  float* w_sh = split_sh;
  float* l_sh = split_sh + a.n_splits;
  const float* rec0 = a.ws + (int64_t{t} * a.n_heads + h) * a.n_splits * (VHD + 2);
  float pre[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) pre[u] = s0 + u < n_used ? rec0[int64_t{s0 + u} * (VHD + 2) + d] : 0.0f;
  float m = -INFINITY;
  for (int32_t s = s0 + d; s < n_used; s += VHD) {
    const float* rec = rec0 + int64_t{s} * (VHD + 2);
    w_sh[s] = rec[VHD];
    l_sh[s] = rec[VHD + 1];
    m = fmaxf(m, rec[VHD]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, off));
  if ((d & 31) == 0) max_sh[d >> 5] = m;
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < VHD / 32; ++w) M = fmaxf(M, max_sh[w]);  // max: exact in any order
  for (int32_t s = s0 + d; s < n_used; s += VHD) w_sh[s] = expf(w_sh[s] - M);
  __syncthreads();
  float L = 0.0f, acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    if (s0 + u < n_used) {
      L = fmaf(l_sh[s0 + u], w_sh[s0 + u], L);
      acc = fmaf(pre[u], w_sh[s0 + u], acc);
    }
  }
#pragma unroll 8
  for (int32_t s = s0 + kPrefetch; s < n_used; ++s) {
    L = fmaf(l_sh[s], w_sh[s], L);
    acc = fmaf(rec0[int64_t{s} * (VHD + 2) + d], w_sh[s], acc);
  }
  *o = acc / L;
}

int32_t splits_for(int32_t max_keys) { return (max_keys + kSplit - 1) / kSplit; }

template <int HD, class Addr>
void launch(const AttnArgs& a, const Addr& addr, cudaStream_t stream) {
  const int32_t passes = (a.group + kPassHeads - 1) / kPassHeads;
  attn_partial_kernel<HD, Addr><<<dim3(a.n_kv * passes, a.n_splits, a.T), kThreads, 0, stream>>>(a, addr);
  CK_LAUNCH("attn_partial_kernel");
  // Programmatic dependent launch: may start before pass 1 ends (it waits
  // inside); later work on the stream still waits for pass 2 as usual.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(a.n_heads, a.T);
  cfg.blockDim = dim3(HD);
  cfg.dynamicSmemBytes = 2 * sizeof(float) * static_cast<size_t>(a.n_splits);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK_CUDA(cudaLaunchKernelEx(&cfg, attn_combine_kernel<HD, Addr>, a, addr));
  CK_LAUNCH("attn_combine_kernel");
}

template <class Addr>
void run_attention(const AttnArgs& a, const Addr& addr, int32_t head_dim, const AttentionLaunch& l) {
  if (a.T == 0) return;
  switch (head_dim) {
    case 64: return launch<64>(a, addr, l.stream);
    case 128: return launch<128>(a, addr, l.stream);
    case 256: return launch<256>(a, addr, l.stream);
    default: CK_REQUIRE(false, "attention: head_dim must be 64, 128 or 256");
  }
}

AttnArgs make_args(const float* q, const f16* k, const f16* v, const int32_t* row_seq, const int32_t* row_pos,
                   float* out, int32_t T, int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t v_head_dim,
                   float scale, int32_t window, float softcap, const AttentionLaunch& l) {
  CK_REQUIRE(window >= 0, "attention: window must be >= 0 (0: global)");
  CK_REQUIRE(softcap >= 0.0f && std::isfinite(softcap), "attention: softcap must be >= 0 (0: none)");
  CK_REQUIRE(T >= 0 && n_heads > 0 && n_kv > 0, "attention: bad shape");
  CK_REQUIRE(n_heads % n_kv == 0, "attention: n_heads must be a multiple of n_kv (GQA)");
  CK_REQUIRE(n_heads / n_kv <= 16, "attention: at most 16 query heads per kv head");
  CK_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "attention: head_dim must be 64, 128 or 256");
  CK_REQUIRE(v_head_dim == head_dim, "attention: the CUDA kernels need v_head_dim == head_dim");
  CK_REQUIRE(l.max_keys > 0, "attention: max_keys must be positive");
  CK_REQUIRE(l.workspace_bytes >= attention_workspace_bytes(T, n_heads, v_head_dim, l.max_keys),
             "attention: workspace too small for T, n_heads, v_head_dim, max_keys");
  CK_REQUIRE(T <= 65535, "attention: T must fit the grid (<= 65535)");
  CK_REQUIRE(l.max_keys <= kMaxKeys, "attention: max_keys above 2097152 is not supported");
  CK_REQUIRE((reinterpret_cast<uintptr_t>(k) & 15u) == 0 && (reinterpret_cast<uintptr_t>(v) & 15u) == 0,
             "attention: K and V pools must be 16-byte aligned");
  AttnArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.row_seq = row_seq;
  a.row_pos = row_pos;
  a.out = out;
  a.ws = static_cast<float*>(l.workspace);
  a.T = T;
  a.n_heads = n_heads;
  a.n_kv = n_kv;
  a.group = n_heads / n_kv;
  a.n_splits = splits_for(l.max_keys);
  a.scale = scale;
  a.window = window;
  a.softcap = softcap;
  return a;
}

}  // namespace

size_t attention_workspace_bytes(int32_t T, int32_t n_heads, int32_t v_head_dim, int32_t max_keys) {
  if (T <= 0 || n_heads <= 0 || v_head_dim <= 0 || max_keys <= 0) return 0;
  return static_cast<size_t>(T) * n_heads * splits_for(max_keys) * (v_head_dim + 2) * sizeof(float);
}

void paged_attention(const ck::PagedAttention& p, const AttentionLaunch& l) {
  const AttnArgs a = make_args(p.q, p.k_pages, p.v_pages, p.row_seq, p.row_pos, p.out, p.T, p.n_heads, p.n_kv,
                               p.head_dim, p.v_head_dim, p.scale, p.window, p.softcap, l);
  CK_REQUIRE(p.page_size > 0 && p.pt_stride > 0 && p.num_pages > 0, "paged_attention: bad page geometry");
  CK_REQUIRE(static_cast<int64_t>(l.max_keys) <= int64_t{p.pt_stride} * p.page_size,
             "paged_attention: max_keys exceeds the page table's capacity");
  const PagedAddr addr{p.page_table, p.pt_stride, p.page_size, p.num_pages};
  run_attention(a, addr, p.head_dim, l);
}

void contiguous_attention(const ck::ContiguousAttention& c, const AttentionLaunch& l) {
  const AttnArgs a = make_args(c.q, c.k, c.v, c.row_seq, c.row_pos, c.out, c.T, c.n_heads, c.n_kv, c.head_dim,
                               c.v_head_dim, c.scale, c.window, c.softcap, l);
  CK_REQUIRE(c.ctx_cap > 0 && l.max_keys <= c.ctx_cap, "contiguous_attention: max_keys exceeds ctx_cap");
  run_attention(a, ContiguousAddr{c.ctx_cap}, c.head_dim, l);
}

}  // namespace ck::cuda
