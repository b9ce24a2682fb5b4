// Split-KV ("flash-decoding") attention over paged or contiguous f16 K/V, for
// a ragged batch of decode and prefill rows. See kernels_cuda.cuh for the
// contract; the math per (row t, query head h):
//   s_j   = scale * q[t,h,:]·k[j,kvh,:]                  j = 0..pos_t
//   split s covers keys [s*S, min((s+1)*S, pos_t+1)), S = kAttnSplitKeys
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
constexpr int kTile = 16;      // keys per warp step: the mma's M for q·K, its K for p·V
constexpr int kPassHeads = 4;  // query heads per block: hi and lo of 4 heads fill the mma's 8 columns
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
};

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

// The f16 pair (x, y) (x in the low half): the hi parts, or with lo the
// residuals x - f16(x), y - f16(y) rounded to f16.
__device__ __forceinline__ uint32_t f16_pair(float x, float y, bool lo) {
  __half hx = __float2half_rn(x), hy = __float2half_rn(y);
  if (lo) {
    hx = __float2half_rn(x - __half2float(hx));
    hy = __float2half_rn(y - __half2float(hy));
  }
  return static_cast<uint32_t>(__half_as_ushort(hx)) | (static_cast<uint32_t>(__half_as_ushort(hy)) << 16);
}

__device__ __forceinline__ uint32_t word(const uint4& u, int e) {
  return e == 0 ? u.x : e == 1 ? u.y : e == 2 ? u.z : u.w;
}

// N 16-byte chunks of cache row `row` (halves off, off + STEP, ...), or zeros
// for a key with no row (past the split or a bad page).
template <int N, int STEP>
__device__ __forceinline__ void load_chunks(const f16* base, int64_t row, int64_t row_stride, int off,
                                            uint4 (&out)[N]) {
  if (row >= 0) {
    const f16* p = base + row * row_stride + off;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __ldg(reinterpret_cast<const uint4*>(p + STEP * i));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // e in [-126, 127]

// Pass 1. Block = (split s, kv head and pass of 4 query heads, row t); 4
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
__global__ void __launch_bounds__(kThreads, HD <= 128 ? 3 : 2) attn_partial_kernel(AttnArgs a, Addr addr) {
  constexpr int KCH = HD / 32;        // K: 16-byte chunks per lane per key
  constexpr int VCH = HD / 64;        // V: 16-byte chunks per lane per key
  constexpr int KSTEPS = HD / 16;     // q·K mma steps (16 dims each)
  constexpr int MTILES = HD / 16;     // p·V mma tiles (16 dims each)
  constexpr bool kEarlyV = HD <= 128;  // V loads issued with K (registers allow it up to HD 128)
  __shared__ float acc_sh[kWarps][kPassHeads][HD];
  __shared__ float m_sh[kWarps][kPassHeads], l_sh[kWarps][kPassHeads];

  const int32_t t = blockIdx.z, s = blockIdx.x;
  const int32_t passes = (a.group + kPassHeads - 1) / kPassHeads;
  const int32_t kvh = static_cast<int32_t>(blockIdx.y) / passes;
  const int32_t g0 = (static_cast<int32_t>(blockIdx.y) % passes) * kPassHeads;  // first group head of this pass
  const int32_t heads = min(kPassHeads, a.group - g0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int32_t pos = a.row_pos[t];
  const int32_t n_keys = pos + 1;
  const int32_t j0 = s * kSplit;
  if (pos < 0 || j0 >= n_keys || !addr.fits(n_keys)) return;  // split unused (combine reads only used splits)
  const int32_t nk = min(kSplit, n_keys - j0);
  const int32_t seq = a.row_seq[t];
  const int64_t row_stride = int64_t{a.n_kv} * HD;  // halves between consecutive cache rows (K and V)
  const f16* kbase = a.k + int64_t{kvh} * HD;
  const f16* vbase = a.v + int64_t{kvh} * HD;

  // ---- q as B fragments: column r = hi (r even) or lo (r odd) of head r/2 ----
  const int qh = r >> 1;
  const bool lo_col = (r & 1) != 0;
  uint32_t qf[KSTEPS][2];
  int shift;  // q of head qh is scaled by 2^-shift
  {
    float qv[KCH][8];
    float mx = 0.0f;
    const bool live = qh < heads;
    const float* qp = a.q + (int64_t{t} * a.n_heads + int64_t{kvh} * a.group + g0 + (live ? qh : 0)) * HD + 8 * c;
#pragma unroll
    for (int i = 0; i < KCH; ++i) {
      const float4 x0 = live ? *reinterpret_cast<const float4*>(qp + 32 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 x1 = live ? *reinterpret_cast<const float4*>(qp + 32 * i + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
      qv[i][0] = x0.x;
      qv[i][1] = x0.y;
      qv[i][2] = x0.z;
      qv[i][3] = x0.w;
      qv[i][4] = x1.x;
      qv[i][5] = x1.y;
      qv[i][6] = x1.z;
      qv[i][7] = x1.w;
#pragma unroll
      for (int u = 0; u < 8; ++u) mx = fmaxf(mx, fabsf(qv[i][u]));
    }
    // The 8 lanes 8 qh .. 8 qh + 7 hold head qh.
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 4));
    // ilogb: 0 -> very negative, inf/NaN -> very positive; clamped so both
    // 2^-shift and scale * 2^shift stay normal floats.
    const int e = mx > 0.0f ? min(max(ilogbf(mx), -100), 100) : -100;
    shift = e - 14;
    const float down = pow2(-shift);
#pragma unroll
    for (int i = 0; i < KCH; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        qf[2 * i + h][0] = f16_pair(qv[i][4 * h] * down, qv[i][4 * h + 1] * down, lo_col);
        qf[2 * i + h][1] = f16_pair(qv[i][4 * h + 2] * down, qv[i][4 * h + 3] * down, lo_col);
      }
  }
  const float sc = a.scale * pow2(__shfl_sync(kFull, shift, 8 * c));  // for head c's scores

  float m_run = -INFINITY, l_run = 0.0f;
  float acc[MTILES][4];
#pragma unroll
  for (int i = 0; i < MTILES; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[i][u] = 0.0f;

  const int32_t n_tiles = (nk + kTile - 1) / kTile;
  for (int32_t tile = warp; tile < n_tiles; tile += kWarps) {
    // Lane l looks up key l & 15 of the tile; the others shuffle its row.
    const int32_t kk = tile * kTile + (lane & 15);
    const int64_t my_row = kk < nk ? addr.row(seq, j0 + kk) : kPastEnd;
    const int64_t row_k0 = __shfl_sync(kFull, my_row, r), row_k8 = __shfl_sync(kFull, my_row, r + 8);
    const int64_t row_v[4] = {__shfl_sync(kFull, my_row, 2 * c), __shfl_sync(kFull, my_row, 2 * c + 1),
                              __shfl_sync(kFull, my_row, 2 * c + 8), __shfl_sync(kFull, my_row, 2 * c + 9)};
    uint4 k0[KCH], k8[KCH], v[4][VCH];
    load_chunks<KCH, 32>(kbase, row_k0, row_stride, 8 * c, k0);
    load_chunks<KCH, 32>(kbase, row_k8, row_stride, 8 * c, k8);
    if constexpr (kEarlyV) {
#pragma unroll
      for (int u = 0; u < 4; ++u) load_chunks<VCH, 64>(vbase, row_v[u], row_stride, 8 * r, v[u]);
    }

    // ---- scores of keys r and r + 8 for head c ------------------------------
    float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < KCH; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mma_16816(sacc, word(k0[i], 2 * h), word(k8[i], 2 * h), word(k0[i], 2 * h + 1), word(k8[i], 2 * h + 1),
                  qf[2 * i + h][0], qf[2 * i + h][1]);
    if constexpr (!kEarlyV) {
#pragma unroll
      for (int u = 0; u < 4; ++u) load_chunks<VCH, 64>(vbase, row_v[u], row_stride, 8 * r, v[u]);
    }
    float s0 = (sacc[0] + sacc[1]) * sc, s1 = (sacc[2] + sacc[3]) * sc;
    if (row_k0 < 0) s0 = row_k0 == kBadPage ? __int_as_float(0x7fc00000) : -INFINITY;
    if (row_k8 < 0) s1 = row_k8 == kBadPage ? __int_as_float(0x7fc00000) : -INFINITY;

    // ---- online softmax: the tile max over the 8 lanes of head c ---------------
    float tm = fmaxf(s0, s1);
    tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 4));
    tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 8));
    tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 16));
    const float m_new = fmaxf(m_run, tm);
    const float alpha = expf(m_run - m_new);  // a tile of only bad keys: NaN, which propagates to out
    const float p0 = expf(s0 - m_new), p1 = expf(s1 - m_new);  // NaN score (bad page) -> NaN
    l_run = l_run * alpha + p0 + p1;
    m_run = m_new;
#pragma unroll
    for (int i = 0; i < MTILES; ++i)
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[i][u] *= alpha;

    // ---- p as B fragments: column r = hi/lo of head r/2, keys 2c, 2c+1, 2c+8, 2c+9
    // p of head h at key k (< 8) is p0 of lane 4 k + h, at key k + 8 its p1.
    const int src = 8 * c + qh;
    const float pa0 = __shfl_sync(kFull, p0, src), pb0 = __shfl_sync(kFull, p0, src + 4);
    const float pa1 = __shfl_sync(kFull, p1, src), pb1 = __shfl_sync(kFull, p1, src + 4);
    const uint32_t pf0 = f16_pair(pa0, pb0, lo_col), pf1 = f16_pair(pa1, pb1, lo_col);

    // ---- acc += V^T p: rows = dims 64 j + 8 r + 2 e (+1 for rows r + 8) ---------
#pragma unroll
    for (int j = 0; j < VCH; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t w0 = word(v[0][j], e), w1 = word(v[1][j], e), w2 = word(v[2][j], e), w3 = word(v[3][j], e);
        mma_16816(acc[4 * j + e], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                  __byte_perm(w2, w3, 0x5410), __byte_perm(w2, w3, 0x7632), pf0, pf1);
      }
  }

  // ---- merge the warps in order 0..3 ------------------------------------------------
  l_run += __shfl_xor_sync(kFull, l_run, 4);
  l_run += __shfl_xor_sync(kFull, l_run, 8);
  l_run += __shfl_xor_sync(kFull, l_run, 16);
  if (c < heads) {
#pragma unroll
    for (int j = 0; j < VCH; ++j)
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

// Pass 2. Block = (head h, row t); thread d owns output dim d. Every thread
// computes M and L the same way (a handful of splits), then its own dim.
template <class Addr>
__global__ void attn_combine_kernel(AttnArgs a, Addr addr, int32_t vhd) {
  const int32_t h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
  float* o = a.out + (int64_t{t} * a.n_heads + h) * vhd + d;
  const int32_t pos = a.row_pos[t];
  const int32_t n_used = pos >= 0 ? pos / kSplit + 1 : 0;
  if (pos < 0 || n_used > a.n_splits || !addr.fits(pos + 1)) {
    *o = __int_as_float(0x7fc00000);  // row beyond max_keys / the cache: visible, not truncated
    return;
  }
  const float* rec0 = a.ws + (int64_t{t} * a.n_heads + h) * a.n_splits * (vhd + 2);
  float M = -INFINITY;
  for (int32_t s = 0; s < n_used; ++s) M = fmaxf(M, rec0[int64_t{s} * (vhd + 2) + vhd]);
  float L = 0.0f, acc = 0.0f;
  for (int32_t s = 0; s < n_used; ++s) {
    const float* rec = rec0 + int64_t{s} * (vhd + 2);
    const float w = expf(rec[vhd] - M);
    L = fmaf(rec[vhd + 1], w, L);
    acc = fmaf(rec[d], w, acc);
  }
  *o = acc / L;
}

int32_t splits_for(int32_t max_keys) { return (max_keys + kSplit - 1) / kSplit; }

template <int HD, class Addr>
void launch_partial(const AttnArgs& a, const Addr& addr, cudaStream_t stream) {
  const int32_t passes = (a.group + kPassHeads - 1) / kPassHeads;
  const dim3 grid(a.n_splits, a.n_kv * passes, a.T);
  attn_partial_kernel<HD, Addr><<<grid, kThreads, 0, stream>>>(a, addr);
  CK_LAUNCH("attn_partial_kernel");
}

template <class Addr>
void run_attention(const AttnArgs& a, const Addr& addr, int32_t head_dim, int32_t v_head_dim,
                   const AttentionLaunch& l) {
  if (a.T == 0) return;
  switch (head_dim) {
    case 64: launch_partial<64>(a, addr, l.stream); break;
    case 128: launch_partial<128>(a, addr, l.stream); break;
    case 256: launch_partial<256>(a, addr, l.stream); break;
    default: CK_REQUIRE(false, "attention: head_dim must be 64, 128 or 256");
  }
  attn_combine_kernel<Addr><<<dim3(a.n_heads, a.T), v_head_dim, 0, l.stream>>>(a, addr, v_head_dim);
  CK_LAUNCH("attn_combine_kernel");
}

AttnArgs make_args(const float* q, const f16* k, const f16* v, const int32_t* row_seq, const int32_t* row_pos,
                   float* out, int32_t T, int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t v_head_dim,
                   float scale, const AttentionLaunch& l) {
  CK_REQUIRE(T >= 0 && n_heads > 0 && n_kv > 0, "attention: bad shape");
  CK_REQUIRE(n_heads % n_kv == 0, "attention: n_heads must be a multiple of n_kv (GQA)");
  CK_REQUIRE(n_heads / n_kv <= 16, "attention: at most 16 query heads per kv head");
  CK_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "attention: head_dim must be 64, 128 or 256");
  CK_REQUIRE(v_head_dim == head_dim, "attention: the CUDA kernels need v_head_dim == head_dim");
  CK_REQUIRE(l.max_keys > 0, "attention: max_keys must be positive");
  CK_REQUIRE(l.workspace_bytes >= attention_workspace_bytes(T, n_heads, v_head_dim, l.max_keys),
             "attention: workspace too small for T, n_heads, v_head_dim, max_keys");
  CK_REQUIRE(T <= 65535 && int64_t{n_kv} * ((n_heads / n_kv + kPassHeads - 1) / kPassHeads) <= 65535,
             "attention: T and n_kv * ceil(group / 4) must fit the grid (<= 65535 each)");
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
  return a;
}

}  // namespace

size_t attention_workspace_bytes(int32_t T, int32_t n_heads, int32_t v_head_dim, int32_t max_keys) {
  if (T <= 0 || n_heads <= 0 || v_head_dim <= 0 || max_keys <= 0) return 0;
  return static_cast<size_t>(T) * n_heads * splits_for(max_keys) * (v_head_dim + 2) * sizeof(float);
}

void paged_attention(const ck::PagedAttention& p, const AttentionLaunch& l) {
  const AttnArgs a = make_args(p.q, p.k_pages, p.v_pages, p.row_seq, p.row_pos, p.out, p.T, p.n_heads, p.n_kv,
                               p.head_dim, p.v_head_dim, p.scale, l);
  CK_REQUIRE(p.page_size > 0 && p.pt_stride > 0 && p.num_pages > 0, "paged_attention: bad page geometry");
  CK_REQUIRE(static_cast<int64_t>(l.max_keys) <= int64_t{p.pt_stride} * p.page_size,
             "paged_attention: max_keys exceeds the page table's capacity");
  const PagedAddr addr{p.page_table, p.pt_stride, p.page_size, p.num_pages};
  run_attention(a, addr, p.head_dim, p.v_head_dim, l);
}

void contiguous_attention(const ck::ContiguousAttention& c, const AttentionLaunch& l) {
  const AttnArgs a = make_args(c.q, c.k, c.v, c.row_seq, c.row_pos, c.out, c.T, c.n_heads, c.n_kv, c.head_dim,
                               c.v_head_dim, c.scale, l);
  CK_REQUIRE(c.ctx_cap > 0 && l.max_keys <= c.ctx_cap, "contiguous_attention: max_keys exceeds ctx_cap");
  run_attention(a, ContiguousAddr{c.ctx_cap}, c.head_dim, c.v_head_dim, l);
}

}  // namespace ck::cuda
