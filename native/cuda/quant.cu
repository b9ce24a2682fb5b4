// Block-quantized weights on the CUDA backend (formats and exactness:
// native/src/quant.h): the matmul and the embedding read the blocks directly,
// dequantizing each value in registers to the same exact f32 the CPU
// backend computes. One warp per output column: lane l walks the row's
// 32-element groups l, l + 32, ... in order with one FMA chain, then a fixed
// butterfly sums the lanes, so each y[t, n] depends only on its own row and
// column (never on T or the other rows) — the CUDA engine's usual contract,
// not the CPU's bits.
#include <cuda_fp16.h>

#include "f16.cuh"
#include "kernels_cuda.cuh"
#include "quant.h"

namespace ck::cuda {
namespace {

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return f16_to_f32_exact(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// Element j < 32 of group g of a row (a group: 32 consecutive elements; the
// row starts at `row`), as the CPU's dequantize computes it.
template <ck::DType WT>
__device__ __forceinline__ float group_value(const uint8_t* row, int64_t g, int j) {
  if constexpr (WT == ck::DType::Q8_0) {
    const uint8_t* b = row + g * 34;
    return half_at(b) * static_cast<float>(static_cast<int8_t>(b[2 + j]));
  } else if constexpr (WT == ck::DType::Q4_0) {
    const uint8_t* b = row + g * 18;
    const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
    return half_at(b) * static_cast<float>(q - 8);
  } else if constexpr (WT == ck::DType::Q4_K) {
    const uint8_t* b = row + (g / 8) * 144;
    const int s = static_cast<int>(g % 8);  // the super-block's group: chunk s / 2, low nibbles when s is even
    const uint8_t* sc = b + 4;
    int scale, min;
    if (s < 4) {
      scale = sc[s] & 63;
      min = sc[s + 4] & 63;
    } else {
      scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
      min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const uint8_t q8 = b[16 + (s / 2) * 32 + j];
    const int q = (s % 2 == 0) ? (q8 & 0xF) : (q8 >> 4);
    const float d1 = half_at(b) * static_cast<float>(scale);
    const float m1 = half_at(b + 2) * static_cast<float>(min);
    return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
  } else {  // Q6_K
    const uint8_t* b = row + (g / 8) * 210;
    const int e = static_cast<int>(g % 8) * 32 + j;  // element of the super-block
    const int h = e / 128, r = e % 128;              // half, and element in it
    const int l = r % 32, quarter = r / 32;          // element l + 32·quarter of the half
    const uint8_t* ql = b + h * 64;
    const uint8_t* qh = b + 128 + h * 32;
    const int8_t* scl = reinterpret_cast<const int8_t*>(b + 192) + h * 8;
    const uint8_t lq = ql[l + (quarter % 2) * 32];
    const int q = ((quarter < 2 ? (lq & 0xF) : (lq >> 4)) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    const float ds = __fmul_rn(half_at(b + 208), static_cast<float>(scl[l / 16 + 2 * quarter]));
    return __fmul_rn(ds, static_cast<float>(q));
  }
}

template <ck::DType WT>
__global__ void quant_matmul_kernel(const float* __restrict__ x, int32_t T, int32_t K, const uint8_t* __restrict__ W,
                                    int64_t row_bytes, int32_t N, const float* __restrict__ bias, float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const uint8_t* row = W + n * row_bytes;
  const int64_t groups = K / 32;
  for (int32_t t = 0; t < T; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * K;
    float acc = 0.0f;
    for (int64_t g = lane; g < groups; g += 32)
      for (int j = 0; j < 32; ++j) acc = __fmaf_rn(xr[g * 32 + j], group_value<WT>(row, g, j), acc);
    for (int off = 16; off > 0; off /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (lane == 0) y[static_cast<int64_t>(t) * N + n] = bias != nullptr ? __fadd_rn(acc, bias[n]) : acc;
  }
}

template <ck::DType WT>
__global__ void quant_embed_kernel(const int32_t* __restrict__ ids, const uint8_t* __restrict__ table, int64_t row_bytes,
                                   int32_t D, float* __restrict__ out) {
  const int32_t t = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(ids[t]) * row_bytes;
  for (int32_t i = threadIdx.x; i < D; i += blockDim.x)
    out[static_cast<int64_t>(t) * D + i] = group_value<WT>(row, i / 32, i % 32);
}

constexpr int kWarpsPerBlock = 8;

}  // namespace

void quant_matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
                  float* y, cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && K > 0 && N > 0 && bytes_of(wt, K) > 0, "quant_matmul: bad shape (K must be whole blocks)");
  if (T == 0) return;
  const auto* w = static_cast<const uint8_t*>(W);
  const int64_t rb = bytes_of(wt, K);
  const unsigned blocks = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned threads = 32 * kWarpsPerBlock;
  switch (wt) {
    case ck::DType::Q8_0: quant_matmul_kernel<ck::DType::Q8_0><<<blocks, threads, 0, stream>>>(x, T, K, w, rb, N, bias, y); break;
    case ck::DType::Q4_0: quant_matmul_kernel<ck::DType::Q4_0><<<blocks, threads, 0, stream>>>(x, T, K, w, rb, N, bias, y); break;
    case ck::DType::Q4_K: quant_matmul_kernel<ck::DType::Q4_K><<<blocks, threads, 0, stream>>>(x, T, K, w, rb, N, bias, y); break;
    case ck::DType::Q6_K: quant_matmul_kernel<ck::DType::Q6_K><<<blocks, threads, 0, stream>>>(x, T, K, w, rb, N, bias, y); break;
    default: CK_REQUIRE(false, "quant_matmul: not a block format");
  }
  CK_LAUNCH("quant_matmul_kernel");
}

void quant_embed(const int32_t* ids, int32_t T, const void* table, ck::DType wt, int32_t D, float* out,
                 cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && D > 0 && bytes_of(wt, D) > 0, "quant_embed: bad shape (D must be whole blocks)");
  if (T == 0) return;
  const auto* w = static_cast<const uint8_t*>(table);
  const int64_t rb = bytes_of(wt, D);
  switch (wt) {
    case ck::DType::Q8_0: quant_embed_kernel<ck::DType::Q8_0><<<T, 128, 0, stream>>>(ids, w, rb, D, out); break;
    case ck::DType::Q4_0: quant_embed_kernel<ck::DType::Q4_0><<<T, 128, 0, stream>>>(ids, w, rb, D, out); break;
    case ck::DType::Q4_K: quant_embed_kernel<ck::DType::Q4_K><<<T, 128, 0, stream>>>(ids, w, rb, D, out); break;
    case ck::DType::Q6_K: quant_embed_kernel<ck::DType::Q6_K><<<T, 128, 0, stream>>>(ids, w, rb, D, out); break;
    default: CK_REQUIRE(false, "quant_embed: not a block format");
  }
  CK_LAUNCH("quant_embed_kernel");
}

}  // namespace ck::cuda
