// The batch-invariant tensor-core GEMM (kernels_cuda.cuh, "matmul"):
// y[T, N] = x[T, K] · W[N, K]^T (+ bias) for f16/bf16 weights.
//
// The canonical order. x is rounded to W's 16-bit type (round to nearest
// even). Every output is computed by mma.sync.m16n8k16 with W as the A
// operand (16 output rows) and x as the B operand (8 token columns), so
// y[t, n] is element (n, t) of a chain of mma instructions over k:
//
//   tot = 0
//   for each piece p of kGemmPiece k (p = 0, 1, ...):
//     acc = 0
//     for each 16-k step of the piece with k0 < K:  acc = mma(W[n, k0:+16], x[t, k0:+16], acc)
//     tot = tot + acc
//   y = tot (+ bias[n])
//
// with operands past K (and rows past N or T) zero. An output's bits depend
// only on its own row of x, its row of W, K and the piece size: not on T,
// the other rows, or which of the two kernels below ran it (both issue the
// same instructions in the same order for every output; the harness checks
// rows alone against rows inside batches that take either kernel).
//
// Two tilings of that order:
// - gemm_tile_kernel (T > kGemmSplitMaxT, prefill): 128 W rows x 128 tokens
//   a block, 8 warps of 64 x 32, K in 32-wide stages through shared memory
//   (W by cp.async, x loaded to registers one stage ahead and converted), acc
//   folded into tot at each piece boundary.
// - gemm_split_kernel (T <= kGemmSplitMaxT, decode): one block per 64 W rows
//   and piece, so even one row of x spreads the weights over many SMs; the
//   block loads its whole W tile at once, writes acc for its piece to the
//   workspace, and the last block of the 64 rows to finish (a counter) folds
//   the pieces in order p = 0, 1, ... and adds the bias.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "kernels_cuda.cuh"

namespace ck::cuda {
namespace {

static_assert(kGemmPiece % 32 == 0, "a piece is a whole number of tile stages");

// ---- instruction wrappers ---------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (and reads nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

// d = a·b + d, A 16x16 row-major (4 regs), B 16x8 column-major (2 regs), f32
// accumulators. Registers only (not volatile: the compiler may schedule it);
// ldmatrix and cp.async stay volatile, they touch shared memory.
template <ck::DType WT>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t* b) {
  if constexpr (WT == ck::DType::F16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Two f32 -> W's 16-bit type, round to nearest even; a in the low half.
template <ck::DType WT>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t u;
  if constexpr (WT == ck::DType::F16) {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&u, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&u, &h, 4);
  }
  return u;
}

// x[t, k .. k+3] as 2 words of W's type (zeros past T or K; K % 8 == 0, so
// a group of 4 is all in or all out).
template <ck::DType WT>
__device__ __forceinline__ uint2 load_x4(const float* __restrict__ x, int32_t T, int32_t K, int64_t t, int64_t k) {
  if (t >= T || k >= K) return make_uint2(0u, 0u);
  const float4 v = *reinterpret_cast<const float4*>(x + t * K + k);
  return make_uint2(pack2<WT>(v.x, v.y), pack2<WT>(v.z, v.w));
}

// ---- the tile kernel (prefill) ---------------------------------------------------
constexpr int kTileM = 128;  // W rows a block
constexpr int kTileN = 128;  // tokens a block
constexpr int kTileK = 32;   // k a stage
constexpr int kStages = 4;
constexpr int kTileThreads = 256;
constexpr int kRowHalves = kTileK + 8;  // a stage row padded to 80 bytes: ldmatrix rows hit distinct banks
constexpr int kStageHalves = (kTileM + kTileN) * kRowHalves;
constexpr size_t kTileSmem = size_t{kStages} * kStageHalves * 2;
// x of one stage in registers, per thread: 128 tokens x 32 k / 256 threads = 16 floats (4 groups of 4).
constexpr int kXGroups = kTileN * kTileK / 4 / kTileThreads;

template <ck::DType WT>
__global__ void __launch_bounds__(kTileThreads, 1)
    gemm_tile_kernel(const float* __restrict__ x, int32_t T, int32_t K, const uint16_t* __restrict__ W, int32_t N,
                     const float* __restrict__ bias, float* __restrict__ y) {
  extern __shared__ __align__(16) uint16_t sm[];  // [kStages] x {W [kTileM][kRowHalves], x [kTileN][kRowHalves]}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // warp tile: W rows 64 wm .. +63, tokens 32 wn .. +31
  const int64_t n0 = int64_t{blockIdx.x} * kTileM, t0 = int64_t{blockIdx.y} * kTileN;
  const int32_t stages = (K + kTileK - 1) / kTileK;

  auto w_stage = [&](int s) { return sm + (s % kStages) * kStageHalves; };
  auto x_stage = [&](int s) { return sm + (s % kStages) * kStageHalves + kTileM * kRowHalves; };
  // W rows of stage st: 128 rows x 4 chunks of 16 bytes, 2 a thread.
  auto issue_w = [&](int32_t st) {
    if (st < stages) {
      uint16_t* dst = w_stage(st);
      const int64_t k0 = int64_t{st} * kTileK;
#pragma unroll
      for (int i = 0; i < kTileM * 4 / kTileThreads; ++i) {
        const int c = tid + i * kTileThreads, row = c >> 2, ch = c & 3;
        const int64_t n = n0 + row, k = k0 + ch * 8;
        const bool in = n < N && k < K;
        cp_async16(dst + row * kRowHalves + ch * 8, in ? static_cast<const void*>(W + n * K + k) : W, in ? 16 : 0);
      }
    }
    cp_async_commit();  // every thread commits a group per call so the wait counts agree
  };
  // x of stage st into registers (converted), then into shared memory.
  uint2 xr[kXGroups];
  auto load_x = [&](int32_t st) {
    const int64_t k0 = int64_t{st} * kTileK;
#pragma unroll
    for (int i = 0; i < kXGroups; ++i) {
      const int g = tid + i * kTileThreads, row = g >> 3, q = g & 7;  // 8 groups of 4 k a token row
      xr[i] = st < stages ? load_x4<WT>(x, T, K, t0 + row, k0 + q * 4) : make_uint2(0u, 0u);
    }
  };
  auto store_x = [&](int32_t st) {
    uint16_t* dst = x_stage(st);
#pragma unroll
    for (int i = 0; i < kXGroups; ++i) {
      const int g = tid + i * kTileThreads, row = g >> 3, q = g & 7;
      *reinterpret_cast<uint2*>(dst + row * kRowHalves + q * 4) = xr[i];
    }
  };

  float acc[4][4][4], tot[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f, tot[i][j][e] = 0.0f;

  for (int s = 0; s < kStages - 1; ++s) {
    issue_w(s);
    load_x(s);
    store_x(s);
  }
  // ldmatrix lane addressing: A (W) rows lane % 16, k half lane / 16; B (x)
  // tokens (lane & 7) + 8 (lane >> 4), k half (lane >> 3) & 1.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
  constexpr int kStagesPerPiece = kGemmPiece / kTileK;

  for (int32_t st = 0; st < stages; ++st) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage st is in shared memory for every thread; stage st - 1's buffers are free
    issue_w(st + kStages - 1);
    load_x(st + kStages - 1);
    const uint16_t* ws = w_stage(st) + (wm * 64) * kRowHalves;
    const uint16_t* xs = x_stage(st) + (wn * 32) * kRowHalves;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      if (int64_t{st} * kTileK + kk >= K) break;  // a step wholly past K is not issued (as in the split kernel)
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) ldmatrix_x4(a[i], ws + (i * 16 + a_row) * kRowHalves + kk + a_col);
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, xs + (j * 8 + b_row) * kRowHalves + kk + b_col);
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma<WT>(acc[i][j], a[i], b[j]);
    }
    store_x(st + kStages - 1);  // its buffer was last read in iteration st - 1, before this iteration's barrier
    if ((st + 1) % kStagesPerPiece == 0 || st + 1 == stages) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) tot[i][j][e] = tot[i][j][e] + acc[i][j][e], acc[i][j][e] = 0.0f;
    }
  }
  cp_async_wait<0>();

  // Accumulator e of (i, j): W row 16 i + g + 8 (e >> 1), token 8 j + 2 c + (e & 1).
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int64_t n = n0 + wm * 64 + i * 16 + g + 8 * e2;
      if (n >= N) continue;
      const float bn = bias != nullptr ? bias[n] : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
          const int64_t t = t0 + wn * 32 + j * 8 + 2 * c + e1;
          const float v = tot[i][j][2 * e2 + e1];
          if (t < T) y[t * N + n] = bias != nullptr ? v + bn : v;
        }
    }
}

// ---- the split kernel (decode) ----------------------------------------------------
constexpr int kSplitM = 64;  // W rows a block: 4 warps of 16
constexpr int kSplitThreads = 128;
constexpr int kSplitRowHalves = kGemmPiece + 8;  // 528-byte rows: ldmatrix rows hit distinct banks

__host__ __device__ constexpr size_t split_smem(int tn) {
  return size_t(kSplitM + 8 * tn) * kSplitRowHalves * 2;
}

// TN n-tiles of 8 tokens (T <= 8 TN). grid (ceil(N / 64), pieces).
template <ck::DType WT, int TN>
__global__ void __launch_bounds__(kSplitThreads)
    gemm_split_kernel(const float* __restrict__ x, int32_t T, int32_t K, const uint16_t* __restrict__ W, int32_t N,
                      const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ part,
                      int32_t* __restrict__ counters) {
  extern __shared__ __align__(16) uint16_t sm[];  // W [kSplitM][kSplitRowHalves], then x [8 TN][kSplitRowHalves]
  uint16_t* xs = sm + kSplitM * kSplitRowHalves;
  __shared__ bool last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = int64_t{blockIdx.x} * kSplitM;
  const int32_t p = blockIdx.y, pieces = gridDim.y;
  const int64_t k0 = int64_t{p} * kGemmPiece;

  // The block's W tile at once: 64 rows x 32 chunks of 16 bytes.
  constexpr int kChunks = kGemmPiece / 8;
  for (int c = tid; c < kSplitM * kChunks; c += kSplitThreads) {
    const int row = c / kChunks, ch = c % kChunks;
    const int64_t n = n0 + row, k = k0 + ch * 8;
    const bool in = n < N && k < K;
    cp_async16(sm + row * kSplitRowHalves + ch * 8, in ? static_cast<const void*>(W + n * K + k) : W, in ? 16 : 0);
  }
  cp_async_commit();
  // x's slice, converted, while W is in flight: 8 TN token rows x 64 groups of 4 k.
  for (int gi = tid; gi < 8 * TN * (kGemmPiece / 4); gi += kSplitThreads) {
    const int row = gi / (kGemmPiece / 4), q = gi % (kGemmPiece / 4);
    *reinterpret_cast<uint2*>(xs + row * kSplitRowHalves + q * 4) = load_x4<WT>(x, T, K, row, k0 + q * 4);
  }
  cp_async_wait<0>();
  __syncthreads();

  float acc[TN][4];
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  const uint16_t* ws = sm + (warp * 16 + (lane & 15)) * kSplitRowHalves + (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
#pragma unroll 4
  for (int kk = 0; kk < kGemmPiece; kk += 16) {
    if (k0 + kk >= K) break;  // as in the tile kernel
    uint32_t a[4];
    ldmatrix_x4(a, ws + kk);
    if constexpr (TN == 1) {
      uint32_t b[2];
      ldmatrix_x2(b, xs + (lane & 7) * kSplitRowHalves + kk + ((lane >> 3) & 1) * 8);
      mma<WT>(acc[0], a, b);
    } else {
#pragma unroll
      for (int j = 0; j < TN; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, xs + (j * 8 + b_row) * kSplitRowHalves + kk + b_col);
        mma<WT>(acc[j], a, r);
        mma<WT>(acc[j + 1], a, r + 2);
      }
    }
  }

  // This piece's acc -> part[p][t][n].
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t n = n0 + warp * 16 + g + 8 * (e >> 1), t = j * 8 + 2 * c + (e & 1);
      if (n < N && t < T) part[(int64_t{p} * T + t) * N + n] = acc[j][e];
    }
  // The last block of these rows to finish folds the pieces in order.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(&counters[blockIdx.x], 1);
    last = prev == pieces - 1;
    if (last) counters[blockIdx.x] = 0;  // ready for the next launch on this stream
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int32_t rows = static_cast<int32_t>(min(int64_t{kSplitM}, int64_t{N} - n0));
  for (int32_t o = tid; o < rows * T; o += kSplitThreads) {
    const int32_t t = o / rows;
    const int64_t n = n0 + o % rows;
    float tot = 0.0f;
    for (int32_t q = 0; q < pieces; ++q) tot = tot + __ldcg(part + (int64_t{q} * T + t) * N + n);
    y[int64_t{t} * N + n] = bias != nullptr ? tot + bias[n] : tot;
  }
}

template <ck::DType WT>
void launch_tile(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                 cudaStream_t stream) {
  static const bool smem_ok = [] {  // more than 48 KB of dynamic shared memory must be asked for, once
    CK_CUDA(cudaFuncSetAttribute(gemm_tile_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kTileSmem)));
    return true;
  }();
  (void)smem_ok;
  const dim3 grid((N + kTileM - 1) / kTileM, (T + kTileN - 1) / kTileN);
  gemm_tile_kernel<WT><<<grid, kTileThreads, kTileSmem, stream>>>(x, T, K, static_cast<const uint16_t*>(W), N,
                                                                   bias, y);
  CK_LAUNCH("gemm_tile_kernel");
}

template <ck::DType WT, int TN>
void launch_split(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias, float* y,
                  GemmWorkspace& ws, cudaStream_t stream) {
  static const bool smem_ok = [] {
    CK_CUDA(cudaFuncSetAttribute(gemm_split_kernel<WT, TN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(split_smem(TN))));
    return true;
  }();
  (void)smem_ok;
  const int32_t blocks = (N + kSplitM - 1) / kSplitM, pieces = (K + kGemmPiece - 1) / kGemmPiece;
  ws.reserve(int64_t{pieces} * T * N, blocks, stream);
  gemm_split_kernel<WT, TN><<<dim3(blocks, pieces), kSplitThreads, split_smem(TN), stream>>>(
      x, T, K, static_cast<const uint16_t*>(W), N, bias, y, ws.partials(), ws.counters());
  CK_LAUNCH("gemm_split_kernel");
}

template <ck::DType WT>
void gemm_mma(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias, float* y,
              cudaStream_t stream, GemmWorkspace* ws) {
  if (T > kGemmSplitMaxT || ws == nullptr) return launch_tile<WT>(x, T, K, W, N, bias, y, stream);
  if (T <= 8) return launch_split<WT, 1>(x, T, K, W, N, bias, y, *ws, stream);
  if (T <= 16) return launch_split<WT, 2>(x, T, K, W, N, bias, y, *ws, stream);
  if (T <= 32) return launch_split<WT, 4>(x, T, K, W, N, bias, y, *ws, stream);
  launch_split<WT, 8>(x, T, K, W, N, bias, y, *ws, stream);
}

}  // namespace

// ---- GemmWorkspace ---------------------------------------------------------------

GemmWorkspace::~GemmWorkspace() {
  if (partials_ != nullptr) cudaFree(partials_);
  if (counters_ != nullptr) cudaFree(counters_);
}

void GemmWorkspace::reserve(int64_t partial_floats, int32_t counters, cudaStream_t stream) {
  if (partial_floats > partial_cap_) {
    // cudaFree waits for the device, so no kernel still reads the old buffer.
    if (partials_ != nullptr) CK_CUDA(cudaFree(partials_));
    partials_ = nullptr;
    partial_cap_ = 0;
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&partials_), static_cast<size_t>(partial_floats) * sizeof(float)));
    partial_cap_ = partial_floats;
  }
  if (counters > counter_cap_) {
    if (counters_ != nullptr) CK_CUDA(cudaFree(counters_));
    counters_ = nullptr;
    counter_cap_ = 0;
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters_), static_cast<size_t>(counters) * sizeof(int32_t)));
    // Zero before the first kernel on `stream` counts; every kernel leaves them zero again.
    CK_CUDA(cudaMemsetAsync(counters_, 0, static_cast<size_t>(counters) * sizeof(int32_t), stream));
    counter_cap_ = counters;
  }
}

// ---- matmul --------------------------------------------------------------------------

void matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
            float* y, cudaStream_t stream, GemmWorkspace* ws) {
  if (wt == ck::DType::F32) return matmul_fma(x, T, K, W, wt, N, bias, y, stream);
  CK_REQUIRE(wt == ck::DType::F16 || wt == ck::DType::BF16, "matmul: unknown weight dtype");
  CK_REQUIRE(T >= 0 && K > 0 && N > 0, "matmul: bad shape");
  CK_REQUIRE(K % 8 == 0, "matmul: K must be a multiple of 8 for 16-bit weights (16-byte rows)");
  CK_REQUIRE((reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(W) & 15u) == 0,
             "matmul: x and W must be 16-byte aligned");
  CK_REQUIRE((T + kTileN - 1) / kTileN <= 65535, "matmul: T too large for one launch");
  if (T == 0) return;
  if (wt == ck::DType::F16) return gemm_mma<ck::DType::F16>(x, T, K, W, N, bias, y, stream, ws);
  gemm_mma<ck::DType::BF16>(x, T, K, W, N, bias, y, stream, ws);
}

}  // namespace ck::cuda
