// Dense ops: the FMA-chain matmul (f32 weights; gemm.cu has the tensor-core one), RMSNorm, RoPE, SwiGLU, embedding.
// Each output element is reduced by one thread (matmul) or one fixed-size
// block (rmsnorm) in an order that depends only on the element's own row, so
// results never depend on T or on the other rows of the batch.
#include <cuda_fp16.h>

#include <cmath>

#include "f16.cuh"
#include "kernels_cuda.cuh"
#include "quant.h"

namespace ck::cuda {
namespace {

template <ck::DType W>
__device__ __forceinline__ float load_w(const void* w, int64_t i) {
  if constexpr (W == ck::DType::F32) return static_cast<const float*>(w)[i];
  if constexpr (W == ck::DType::F16) return f16_to_f32_exact(static_cast<const uint16_t*>(w)[i]);
  if constexpr (W == ck::DType::BF16) return bf16_to_f32_exact(static_cast<const uint16_t*>(w)[i]);
  return 0.0f;
}

// A weight that only ever enters an FMA: f16 widened by the hardware
// conversion (exact, like f16_to_f32_exact; a NaN's payload may differ, but
// the FMA returns the canonical NaN either way, so the sums' bits are the
// same). Fewer instructions and registers than the bit-level formula.
template <ck::DType W>
__device__ __forceinline__ float load_w_fma(const void* w, int64_t i) {
  if constexpr (W == ck::DType::F16) return __half2float(__ushort_as_half(static_cast<const unsigned short*>(w)[i]));
  return load_w<W>(w, i);
}

// ---- matmul ------------------------------------------------------------------
// Block tile kBM rows of x by kBN rows of W (outputs), 16x16 threads, each
// thread 4x4 outputs at rows ty + 16 i and columns tx + 16 j. K is walked in
// tiles of kBK in increasing order and, inside a tile, k increasing: every
// y[t,n] is the FMA chain sum_{k=0}^{K-1} x[t,k] W[n,k] (zero padding past K
// adds exact zeros), then + bias[n].
constexpr int kBM = 64, kBN = 64, kBK = 16, kTX = 16, kTY = 16;

template <ck::DType WT>
__global__ void __launch_bounds__(kTX* kTY) matmul_kernel(const float* __restrict__ x, int32_t T, int32_t K,
                                                          const void* __restrict__ W, int32_t N,
                                                          const float* __restrict__ bias, float* __restrict__ y) {
  __shared__ float xs[kBK][kBM + 1];  // transposed: xs[k][row]
  __shared__ float ws[kBK][kBN + 1];  // ws[k][col]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kTX + tx;
  const int64_t row0 = int64_t{blockIdx.y} * kBM, col0 = int64_t{blockIdx.x} * kBN;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int32_t k0 = 0; k0 < K; k0 += kBK) {
    // 64x16 elements per tile, 256 threads: 4 each; kk fastest for coalescing.
#pragma unroll
    for (int e = 0; e < (kBM * kBK) / (kTX * kTY); ++e) {
      const int idx = tid + e * kTX * kTY;
      const int kk = idx % kBK, r = idx / kBK;
      const int64_t k = k0 + kk;
      const int64_t xr = row0 + r, wr = col0 + r;
      xs[kk][r] = (xr < T && k < K) ? x[xr * K + k] : 0.0f;
      ws[kk][r] = (wr < N && k < K) ? load_w_fma<WT>(W, wr * K + k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float xv[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = xs[kk][ty + kTY * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = ws[kk][tx + kTX * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + ty + kTY * i;
    if (r >= T) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tx + kTX * j;
      if (c < N) y[r * N + c] = bias != nullptr ? acc[i][j] + bias[c] : acc[i][j];
    }
  }
}

// ---- matmul, small T (decode) ---------------------------------------------------
// The same arithmetic as matmul_kernel (each y[t,n] is the FMA chain
// fmaf(x[t,k], W[n,k], acc) over k = 0..K-1 in increasing order, then + bias),
// so a row gives the same bits through either kernel: the switch on T never
// changes a row's result. Only the schedule differs, for the case where W is
// the whole cost (decode: T rows, each W element used T times): a block owns
// 32 outputs n (one per lane) and streams their W rows, with the matching
// slice of x, through shared memory in stages of 16 KB of W with cp.async,
// kMvStages deep, so ~48 KB of W per block is in flight; warp w runs the
// chains of rows t = w, w + 8, ... (R of them, interleaved), reading W and x
// from shared memory (x broadcast to the warp). f16 weights are widened as in
// load_w_fma. Measured on H200 (K = N = 4096, f16 W, T = 1 / 8 / 32):
// 8 warps 0.045 / 0.047 / 0.122 ms; 4 warps (2 rows a warp at T = 8)
// 0.053 / 0.079 / 0.219 ms; reading x through L1 instead of shared memory
// 0.123 ms at T = 8 (each warp waited on L2 every 8 k); loading the next
// step's operands one step ahead by hand did not help at 8 warps and 16 warps
// were slower. The single chain per output (4096 dependent FMAs) bounds T = 1:
// one warp per SM has all the work.
constexpr int kMvN = 32;          // outputs (W rows) a block: one per lane
constexpr int kMvWarps = 8;       // warp w takes rows t = w + 8 r, r < R
constexpr int kMvStages = 4;      // W stages in shared memory
constexpr int kMvStageBytes = 16384;
constexpr int kMvRowPad = 16;     // bytes after each W row slice: the lanes' 16-byte reads hit distinct banks
constexpr int32_t kMvMaxT = 4 * kMvWarps;  // 32 rows: R = 4

constexpr int kMvRowBytes = kMvStageBytes / kMvN + kMvRowPad;  // one W row's slice of a stage in shared memory

// Shared memory of one stage: the W slice, then x[T][KC] f32 (KC = k per stage).
__host__ __device__ constexpr size_t mv_stage_bytes(int32_t T, int wbytes) {
  return size_t{kMvN} * kMvRowBytes + size_t(T) * (kMvStageBytes / (kMvN * wbytes)) * 4;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(gmem));
}

// 8 consecutive weights of a row slice in shared memory, as f32.
template <ck::DType WT>
__device__ __forceinline__ void mv_weights(const unsigned char* p, float (&w)[8]) {
  if constexpr (WT == ck::DType::F32) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 16);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (WT == ck::DType::F16) {
        w[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(h[i] & 0xffffu)));
        w[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(h[i] >> 16)));
      } else {
        w[2 * i] = __uint_as_float(h[i] << 16);
        w[2 * i + 1] = __uint_as_float(h[i] & 0xffff0000u);
      }
    }
  }
}

// Needs K % 8 == 0 and 16-byte aligned x and W (checked by the caller).
template <ck::DType WT, int R>
__global__ void __launch_bounds__(kMvN* kMvWarps) matmul_small_t_kernel(const float* __restrict__ x, int32_t T,
                                                                         int32_t K, const void* __restrict__ W,
                                                                         int32_t N, const float* __restrict__ bias,
                                                                         float* __restrict__ y) {
  constexpr int WB = WT == ck::DType::F32 ? 4 : 2;
  constexpr int KC = kMvStageBytes / (kMvN * WB);  // k per stage: 256 (f16, bf16) or 128 (f32)
  constexpr int ROW = kMvRowBytes;
  constexpr int CPR = KC * WB / 16;  // 16-byte chunks of a W row slice
  constexpr int XPR = KC * 4 / 16;   // 16-byte chunks of an x row slice
  extern __shared__ __align__(16) unsigned char sm[];  // [kMvStages] x {W [kMvN][ROW], x [T][KC]}
  const size_t stage_bytes = mv_stage_bytes(T, WB);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = int64_t{blockIdx.x} * kMvN;
  const int32_t n_stages = (K + KC - 1) / KC;
  const unsigned char* wb = static_cast<const unsigned char*>(W);
  const int64_t w_row = int64_t{K} * WB;  // bytes of a W row

  // Stage st: W[n0 .. n0+31][st*KC .. +KC) and x[0 .. T-1][st*KC .. +KC)
  // into buffer st % kMvStages. Every thread commits a group per call (empty
  // past the end) so wait_group counts match across threads and stages.
  auto issue = [&](int32_t st) {
    if (st < n_stages) {
      unsigned char* dst = sm + (st % kMvStages) * stage_bytes;
      const int64_t kb0 = int64_t{st} * KC * WB;
      const int64_t chunks = min(int64_t{CPR}, (w_row - kb0) / 16);
      for (int i = threadIdx.x; i < kMvN * CPR; i += kMvN * kMvWarps) {
        const int row = i / CPR, ch = i % CPR;
        if (ch < chunks && n0 + row < N) cp_async16(dst + row * ROW + ch * 16, wb + (n0 + row) * w_row + kb0 + ch * 16);
      }
      float* xs = reinterpret_cast<float*>(dst + kMvN * ROW);
      const int32_t k0 = st * KC, xchunks = min(KC, K - k0) / 4;
      for (int i = threadIdx.x; i < T * XPR; i += kMvN * kMvWarps) {
        const int t = i / XPR, ch = i % XPR;
        if (ch < xchunks) cp_async16(xs + t * KC + ch * 4, x + int64_t{t} * K + k0 + ch * 4);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int st = 0; st < kMvStages - 1; ++st) issue(st);
  for (int32_t st = 0; st < n_stages; ++st) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kMvStages - 2) : "memory");
    __syncthreads();  // stage st landed for all threads; stage st - 1's buffer is free
    issue(st + kMvStages - 1);
    const unsigned char* wr = sm + (st % kMvStages) * stage_bytes + lane * ROW;
    const float* xs = reinterpret_cast<const float*>(sm + (st % kMvStages) * stage_bytes + kMvN * ROW);
    const int32_t k0 = st * KC, kn = min(KC, K - k0);
#pragma unroll 2
    for (int32_t kk = 0; kk < kn; kk += 8) {
      float w[8];
      mv_weights<WT>(wr + kk * WB, w);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int32_t t = warp + kMvWarps * r;
        if (t < T) {
          const float* xp = xs + t * KC + kk;
          const float4 a = *reinterpret_cast<const float4*>(xp), b = *reinterpret_cast<const float4*>(xp + 4);
          const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] = fmaf(xv[i], w[i], acc[r]);
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  const int64_t n = n0 + lane;
  if (n >= N) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int32_t t = warp + kMvWarps * r;
    if (t < T) y[int64_t{t} * N + n] = bias != nullptr ? acc[r] + bias[n] : acc[r];
  }
}

template <ck::DType WT, int R>
void launch_small_t(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                    cudaStream_t stream) {
  constexpr int WB = WT == ck::DType::F32 ? 4 : 2;
  static const bool smem_ok = [] {  // more than 48 KB of dynamic shared memory must be asked for, once
    CK_CUDA(cudaFuncSetAttribute(matmul_small_t_kernel<WT, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kMvStages * mv_stage_bytes(kMvWarps * R, WB))));
    return true;
  }();
  (void)smem_ok;
  const size_t smem = kMvStages * mv_stage_bytes(T, WB);
  matmul_small_t_kernel<WT, R><<<(N + kMvN - 1) / kMvN, kMvN * kMvWarps, smem, stream>>>(x, T, K, W, N, bias, y);
}

template <ck::DType WT>
void matmul_small_t(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                    cudaStream_t stream) {
  if (T <= kMvWarps) return launch_small_t<WT, 1>(x, T, K, W, N, bias, y, stream);
  if (T <= 2 * kMvWarps) return launch_small_t<WT, 2>(x, T, K, W, N, bias, y, stream);
  launch_small_t<WT, 4>(x, T, K, W, N, bias, y, stream);
}

// ---- rmsnorm -------------------------------------------------------------------
constexpr int kNormThreads = 256;

template <ck::DType WT>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(const float* __restrict__ x, const void* __restrict__ w,
                                                               int32_t D, float eps, float* __restrict__ y) {
  __shared__ double warp_sums[kNormThreads / 32];
  __shared__ float inv_sh;
  const float* xr = x + int64_t{blockIdx.x} * D;
  float* yr = y + int64_t{blockIdx.x} * D;
  // Sum of squares in f64 (as the CPU backend does: no f32 cancellation for
  // wide rows). Thread i sums d = i, i+256, ... in order; warps reduce by a
  // fixed shuffle tree; thread 0 adds the 8 warp sums in order 0..7.
  double ss = 0.0;
  for (int32_t d = threadIdx.x; d < D; d += kNormThreads) ss += static_cast<double>(xr[d]) * xr[d];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < kNormThreads / 32; ++i) total += warp_sums[i];
    inv_sh = static_cast<float>(1.0 / sqrt(total / D + static_cast<double>(eps)));
  }
  __syncthreads();
  const float inv = inv_sh;
  for (int32_t d = threadIdx.x; d < D; d += kNormThreads) yr[d] = (xr[d] * inv) * load_w<WT>(w, d);
}

// ---- rope, swiglu, embed -----------------------------------------------------------
__global__ void rope_kernel(float* __restrict__ x, int32_t T, int32_t n_heads, int32_t head_dim,
                            const int32_t* __restrict__ pos, const float* __restrict__ inv_freq) {
  const int32_t half = head_dim / 2;
  const int64_t n = int64_t{T} * n_heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int32_t i = static_cast<int32_t>(e % half);
    const int64_t th = e / half;  // t * n_heads + h
    const int32_t t = static_cast<int32_t>(th / n_heads);
    // theta in f64 (as the CPU backend does): in f32, p * inv_freq loses
    // ~p * 6e-8 rad of phase, 5e-4 at p = 8192.
    double sd, cd;
    sincos(static_cast<double>(pos[t]) * static_cast<double>(inv_freq[i]), &sd, &cd);
    const float s = static_cast<float>(sd), c = static_cast<float>(cd);
    float* v = x + th * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                              float* __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[e];
    out[e] = g / (1.0f + expf(-g)) * up[e];
  }
}

template <ck::DType WT>
__global__ void embed_kernel(const int32_t* __restrict__ ids, const void* __restrict__ emb, int32_t vocab,
                             int32_t D, float* __restrict__ out) {
  const int32_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + int64_t{t} * D;
  const bool ok = id >= 0 && id < vocab;
  for (int32_t d = threadIdx.x; d < D; d += blockDim.x)
    o[d] = ok ? load_w<WT>(emb, int64_t{id} * D + d) : __int_as_float(0x7fc00000);
}

int elementwise_grid(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

void require_dtype(ck::DType wt, const char* what) {
  CK_REQUIRE(wt == ck::DType::F32 || wt == ck::DType::F16 || wt == ck::DType::BF16,
             std::string(what) + ": unknown weight dtype");
}

}  // namespace

void matmul_fma(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
                float* y, cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && K > 0 && N > 0, "matmul: bad shape");
  CK_REQUIRE((T + kBM - 1) / kBM <= 65535, "matmul: T too large for one launch");
  if (ck::is_quantized(wt)) return quant_matmul(x, T, K, W, wt, N, bias, y, stream);
  require_dtype(wt, "matmul");
  if (T == 0) return;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(W) & 15u) == 0;
  if (T <= kMvMaxT && K % 8 == 0 && aligned) {  // decode-sized batch: stream W (same bits as below)
    switch (wt) {
      case ck::DType::F32: matmul_small_t<ck::DType::F32>(x, T, K, W, N, bias, y, stream); break;
      case ck::DType::F16: matmul_small_t<ck::DType::F16>(x, T, K, W, N, bias, y, stream); break;
      case ck::DType::BF16: matmul_small_t<ck::DType::BF16>(x, T, K, W, N, bias, y, stream); break;
      default: break;  // block formats never get here (dispatched above; never norms)
    }
    CK_LAUNCH("matmul_small_t_kernel");
    return;
  }
  const dim3 grid((N + kBN - 1) / kBN, (T + kBM - 1) / kBM), block(kTX, kTY);
  switch (wt) {
    case ck::DType::F32: matmul_kernel<ck::DType::F32><<<grid, block, 0, stream>>>(x, T, K, W, N, bias, y); break;
    case ck::DType::F16: matmul_kernel<ck::DType::F16><<<grid, block, 0, stream>>>(x, T, K, W, N, bias, y); break;
    case ck::DType::BF16: matmul_kernel<ck::DType::BF16><<<grid, block, 0, stream>>>(x, T, K, W, N, bias, y); break;
    default: break;  // block formats never get here (dispatched above; never norms)
  }
  CK_LAUNCH("matmul_kernel");
}

void rmsnorm(const float* x, const void* w, ck::DType wt, int32_t T, int32_t D, float eps, float* y,
             cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && D > 0 && eps >= 0.0f, "rmsnorm: bad shape or eps");
  require_dtype(wt, "rmsnorm");
  if (T == 0) return;
  switch (wt) {
    case ck::DType::F32: rmsnorm_kernel<ck::DType::F32><<<T, kNormThreads, 0, stream>>>(x, w, D, eps, y); break;
    case ck::DType::F16: rmsnorm_kernel<ck::DType::F16><<<T, kNormThreads, 0, stream>>>(x, w, D, eps, y); break;
    case ck::DType::BF16: rmsnorm_kernel<ck::DType::BF16><<<T, kNormThreads, 0, stream>>>(x, w, D, eps, y); break;
    default: break;  // block formats never get here (dispatched above; never norms)
  }
  CK_LAUNCH("rmsnorm_kernel");
}

void rope(float* x, int32_t T, int32_t n_heads, int32_t head_dim, const int32_t* pos, const float* inv_freq,
          cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope: bad shape (head_dim must be even)");
  const int64_t n = int64_t{T} * n_heads * (head_dim / 2);
  if (n == 0) return;
  rope_kernel<<<elementwise_grid(n, 256), 256, 0, stream>>>(x, T, n_heads, head_dim, pos, inv_freq);
  CK_LAUNCH("rope_kernel");
}

void swiglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && F > 0, "swiglu: bad shape");
  const int64_t n = int64_t{T} * F;
  if (n == 0) return;
  swiglu_kernel<<<elementwise_grid(n, 256), 256, 0, stream>>>(gate, up, n, out);
  CK_LAUNCH("swiglu_kernel");
}

void embed(const int32_t* ids, int32_t T, const void* embedding, ck::DType wt, int32_t vocab, int32_t D, float* out,
           cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && vocab > 0 && D > 0, "embed: bad shape");
  if (ck::is_quantized(wt)) return quant_embed(ids, T, embedding, wt, D, out, stream);
  require_dtype(wt, "embed");
  if (T == 0) return;
  const int threads = D >= 1024 ? 256 : 128;
  switch (wt) {
    case ck::DType::F32: embed_kernel<ck::DType::F32><<<T, threads, 0, stream>>>(ids, embedding, vocab, D, out); break;
    case ck::DType::F16: embed_kernel<ck::DType::F16><<<T, threads, 0, stream>>>(ids, embedding, vocab, D, out); break;
    case ck::DType::BF16:
      embed_kernel<ck::DType::BF16><<<T, threads, 0, stream>>>(ids, embedding, vocab, D, out);
      break;
    default: break;  // block formats are dispatched above (quant.cu)
  }
  CK_LAUNCH("embed_kernel");
}

}  // namespace ck::cuda
