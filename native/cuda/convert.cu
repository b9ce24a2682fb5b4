// Element-wise conversions and the routed append. Grid-stride loops over a
// fixed block size; each element is independent, so nothing to order.
#include "f16.cuh"
#include "kernels_cuda.cuh"

namespace ck::cuda {
namespace {

constexpr int kBlock = 256;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, int64_t n, f16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{kBlock} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kBlock)
    out[i] = f32_to_f16_rne(x[i]);
}

__global__ void f16_to_f32_kernel(const f16* __restrict__ x, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{kBlock} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kBlock)
    out[i] = f16_to_f32_exact(x[i]);
}

__global__ void bf16_to_f32_kernel(const bf16* __restrict__ x, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{kBlock} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kBlock)
    out[i] = bf16_to_f32_exact(x[i]);
}

// One block per row b; threads stride the row. 4 elements at a time (16-byte
// f32 loads, 8-byte f16 stores) when row_elems % 4 == 0, which also keeps
// every row 16-byte aligned given 16-byte-aligned base pointers.
__global__ void routed_append_kernel(const float* __restrict__ rows, const int32_t* __restrict__ slots,
                                     int32_t row_elems, int64_t num_slots, f16* __restrict__ pages) {
  const int32_t b = blockIdx.x;
  const int64_t slot = slots[b];
  if (slot < 0 || slot >= num_slots) return;  // host validation failed to run: write nothing
  const float* src = rows + int64_t{b} * row_elems;
  f16* dst = pages + slot * row_elems;
  if ((row_elems & 3) == 0) {
    const float4* src4 = reinterpret_cast<const float4*>(src);
    uint2* dst4 = reinterpret_cast<uint2*>(dst);
    for (int32_t i = threadIdx.x; i < row_elems / 4; i += blockDim.x) {
      const float4 v = src4[i];
      uint2 packed;
      packed.x = uint32_t{f32_to_f16_rne(v.x)} | (uint32_t{f32_to_f16_rne(v.y)} << 16);
      packed.y = uint32_t{f32_to_f16_rne(v.z)} | (uint32_t{f32_to_f16_rne(v.w)} << 16);
      dst4[i] = packed;
    }
  } else {
    for (int32_t i = threadIdx.x; i < row_elems; i += blockDim.x) dst[i] = f32_to_f16_rne(src[i]);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void f32_to_f16(const float* x, int64_t n, f16* out, cudaStream_t stream) {
  CK_REQUIRE(n >= 0, "f32_to_f16: negative element count");
  if (n == 0) return;
  f32_to_f16_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n, out);
  CK_LAUNCH("f32_to_f16_kernel");
}

void f16_to_f32(const f16* x, int64_t n, float* out, cudaStream_t stream) {
  CK_REQUIRE(n >= 0, "f16_to_f32: negative element count");
  if (n == 0) return;
  f16_to_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n, out);
  CK_LAUNCH("f16_to_f32_kernel");
}

void bf16_to_f32(const bf16* x, int64_t n, float* out, cudaStream_t stream) {
  CK_REQUIRE(n >= 0, "bf16_to_f32: negative element count");
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n, out);
  CK_LAUNCH("bf16_to_f32_kernel");
}

void routed_append(const float* rows, const int32_t* slots, int32_t B, int32_t row_elems, int64_t num_slots,
                   f16* pages, cudaStream_t stream) {
  CK_REQUIRE(B >= 0 && row_elems > 0 && num_slots > 0, "routed_append: bad shape");
  CK_REQUIRE(B <= 2147483647, "routed_append: too many rows");
  CK_REQUIRE((row_elems & 3) != 0 || (aligned16(rows) && aligned16(pages)),
             "routed_append: rows and pages must be 16-byte aligned");
  if (B == 0) return;
  const int threads = row_elems >= 1024 ? 256 : 128;
  routed_append_kernel<<<B, threads, 0, stream>>>(rows, slots, row_elems, num_slots, pages);
  CK_LAUNCH("routed_append_kernel");
}

}  // namespace ck::cuda
