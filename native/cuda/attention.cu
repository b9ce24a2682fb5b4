// Split-KV ("flash-decoding") attention over paged or contiguous f16 K/V, for
// a ragged batch of decode and prefill rows. See kernels_cuda.cuh for the
// contract; the math per (row t, query head h):
//   s_j   = scale * q[t,h,:]·k[j,kvh,:]                  j = 0..pos_t
//   split s covers keys [s*S, min((s+1)*S, pos_t+1)), S = kAttnSplitKeys
//   m_s = max_j s_j,  l_s = sum_j e^(s_j - m_s),  a_s = sum_j e^(s_j - m_s) v_j
//   M = max_s m_s,  out = (sum_s a_s e^(m_s-M)) / (sum_s l_s e^(m_s-M))
// Every sum runs in a fixed order (per-lane chains in increasing key order, a
// fixed shuffle tree, warps added 0,1,2,3, splits added in increasing s), and
// the split bounds are absolute key positions, so a row's bits depend only on
// its own q, keys and values.
#include <cmath>

#include "f16.cuh"
#include "kernels_cuda.cuh"

namespace ck::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kSplit = kAttnSplitKeys;
constexpr int kUnroll = 4;  // keys per warp whose loads are issued before the first use

// Key position j of a row -> index of its K/V row in the [rows, n_kv, dim]
// view of the cache, or -1 when the page table points outside the pool.
struct PagedAddr {
  const int32_t* page_table;
  int32_t pt_stride, page_size;
  int64_t num_pages;
  __device__ int64_t row(int32_t seq, int32_t j) const {
    const int32_t pi = j / page_size;
    if (pi >= pt_stride) return -1;
    const int64_t page = page_table[int64_t{seq} * pt_stride + pi];
    if (page < 0 || page >= num_pages) return -1;
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

// Loads N consecutive f16 (N in {2, 4, 8}: 4-, 8- or 16-byte loads) as f32.
template <int N>
__device__ __forceinline__ void load_f16(const f16* p, float (&out)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 halves per lane");
  uint32_t w[N / 2];
  if constexpr (N == 2) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    w[0] = u.x;
    w[1] = u.y;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    w[0] = u.x;
    w[1] = u.y;
    w[2] = u.z;
    w[3] = u.w;
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    out[2 * i] = f16_to_f32_exact(static_cast<uint16_t>(w[i] & 0xffffu));
    out[2 * i + 1] = f16_to_f32_exact(static_cast<uint16_t>(w[i] >> 16));
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Pass 1. Block = (split s, kv head, row t); 4 warps. Lane l owns dims
// [l*DPL, (l+1)*DPL) of K and [l*VDPL, (l+1)*VDPL) of V; warp w owns the
// split's keys w, w+4, w+8, ... Handles all `group` query heads of the kv head
// so K and V are read once per kv head.
template <int HD, int VHD, int MAXG, class Addr>
__global__ void __launch_bounds__(kThreads) attn_partial_kernel(AttnArgs a, Addr addr) {
  constexpr int DPL = HD / 32;
  constexpr int VDPL = VHD / 32;
  __shared__ float p_sh[MAXG][kSplit];  // scores, then e^(s - m)
  __shared__ float m_sh[MAXG], l_sh[MAXG];
  __shared__ float acc_sh[MAXG][VHD];   // cross-warp sum, warps added in order 0,1,2,3

  const int32_t t = blockIdx.z, kvh = blockIdx.y, s = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t pos = a.row_pos[t];
  const int32_t n_keys = pos + 1;
  const int32_t j0 = s * kSplit;
  if (pos < 0 || j0 >= n_keys || !addr.fits(n_keys)) return;  // split unused (combine reads only used splits)
  const int32_t nk = min(kSplit, n_keys - j0);
  const int32_t seq = a.row_seq[t];
  const int32_t G = a.group;
  const int64_t kv_stride_k = int64_t{a.n_kv} * HD;
  const int64_t kv_stride_v = int64_t{a.n_kv} * VHD;
  const f16* kbase = a.k + int64_t{kvh} * HD + lane * DPL;
  const f16* vbase = a.v + int64_t{kvh} * VHD + lane * VDPL;

  float q[MAXG][DPL];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g < G) {
      const float* qp = a.q + (int64_t{t} * a.n_heads + int64_t{kvh} * G + g) * HD + lane * DPL;
#pragma unroll
      for (int i = 0; i < DPL; ++i) q[g][i] = qp[i];
    }
  }

  // ---- scores: p_sh[g][kk] = scale * q_g · k_(j0+kk) --------------------
  for (int32_t base = warp; base < nk; base += kWarps * kUnroll) {
    float kf[kUnroll][DPL];
    bool bad[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t kk = base + u * kWarps;
      bad[u] = false;
      if (kk < nk) {
        const int64_t r = addr.row(seq, j0 + kk);
        bad[u] = r < 0;
        if (!bad[u]) load_f16<DPL>(kbase + r * kv_stride_k, kf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t kk = base + u * kWarps;
      if (kk >= nk) break;
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g < G) {
          float d = 0.0f;
          if (!bad[u]) {
#pragma unroll
            for (int i = 0; i < DPL; ++i) d = fmaf(q[g][i], kf[u][i], d);
          }
          d = warp_sum(d);
          if (lane == 0) p_sh[g][kk] = bad[u] ? __int_as_float(0x7fc00000) : a.scale * d;
        }
      }
    }
  }
  __syncthreads();

  // ---- per head: m = max, p = e^(s - m), l = sum p --------------------------
  for (int g = warp; g < G; g += kWarps) {
    float m = -INFINITY;
    for (int32_t kk = lane; kk < nk; kk += 32) m = fmaxf(m, p_sh[g][kk]);
    m = warp_max(m);
    float l = 0.0f;
    for (int32_t kk = lane; kk < nk; kk += 32) {
      const float p = expf(p_sh[g][kk] - m);  // NaN score (bad page) -> NaN, propagates to out
      p_sh[g][kk] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      m_sh[g] = m;
      l_sh[g] = l;
    }
  }
  __syncthreads();

  // ---- acc[g][:] = sum_kk p[g][kk] v_kk -------------------------------------
  float acc[MAXG][VDPL];
#pragma unroll
  for (int g = 0; g < MAXG; ++g)
#pragma unroll
    for (int i = 0; i < VDPL; ++i) acc[g][i] = 0.0f;
  for (int32_t base = warp; base < nk; base += kWarps * kUnroll) {
    float vf[kUnroll][VDPL];
    bool bad[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t kk = base + u * kWarps;
      bad[u] = false;
      if (kk < nk) {
        const int64_t r = addr.row(seq, j0 + kk);
        bad[u] = r < 0;
        if (!bad[u]) load_f16<VDPL>(vbase + r * kv_stride_v, vf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t kk = base + u * kWarps;
      if (kk >= nk || bad[u]) continue;  // a bad key already made p (and so l) NaN
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g < G) {
          const float p = p_sh[g][kk];
#pragma unroll
          for (int i = 0; i < VDPL; ++i) acc[g][i] = fmaf(p, vf[u][i], acc[g][i]);
        }
      }
    }
  }
  // Warps add into acc_sh in the fixed order 0, 1, 2, 3; warp 3 writes out.
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g < G) {
#pragma unroll
          for (int i = 0; i < VDPL; ++i) {
            const int d = lane * VDPL + i;
            const float sum = w == 0 ? acc[g][i] : acc_sh[g][d] + acc[g][i];
            if (w < kWarps - 1) {
              acc_sh[g][d] = sum;
            } else {
              const int64_t h = int64_t{kvh} * G + g;
              float* rec = a.ws + ((int64_t{t} * a.n_heads + h) * a.n_splits + s) * (VHD + 2);
              rec[d] = sum;
              if (d == 0) {
                rec[VHD] = m_sh[g];
                rec[VHD + 1] = l_sh[g];
              }
            }
          }
        }
      }
    }
    __syncthreads();
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

template <int HD, int MAXG, class Addr>
void launch_partial(const AttnArgs& a, const Addr& addr, cudaStream_t stream) {
  const dim3 grid(a.n_splits, a.n_kv, a.T);
  attn_partial_kernel<HD, HD, MAXG, Addr><<<grid, kThreads, 0, stream>>>(a, addr);
  CK_LAUNCH("attn_partial_kernel");
}

template <int HD, class Addr>
void dispatch_group(const AttnArgs& a, const Addr& addr, cudaStream_t stream) {
  if (a.group <= 1) return launch_partial<HD, 1>(a, addr, stream);
  if (a.group <= 2) return launch_partial<HD, 2>(a, addr, stream);
  if (a.group <= 4) return launch_partial<HD, 4>(a, addr, stream);
  if (a.group <= 8) return launch_partial<HD, 8>(a, addr, stream);
  return launch_partial<HD, 16>(a, addr, stream);
}

template <class Addr>
void run_attention(const AttnArgs& a, const Addr& addr, int32_t head_dim, int32_t v_head_dim,
                   const AttentionLaunch& l) {
  if (a.T == 0) return;
  switch (head_dim) {
    case 64: dispatch_group<64>(a, addr, l.stream); break;
    case 128: dispatch_group<128>(a, addr, l.stream); break;
    case 256: dispatch_group<256>(a, addr, l.stream); break;
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
  CK_REQUIRE(int64_t{n_kv} * T <= 65535LL * 65535LL && T <= 65535 && n_kv <= 65535,
             "attention: T and n_kv must fit the grid (<= 65535 each)");
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
