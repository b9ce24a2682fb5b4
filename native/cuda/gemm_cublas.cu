// cuBLAS GEMM: the throughput path, NOT batch-invariant (cuBLAS picks its
// algorithm by shape; see kernels_cuda.cuh). Compiled only where the cuBLAS
// headers exist (the GPU machine; not this project's CI machine, whose CUDA
// toolkit has no cuBLAS), so the whole file is guarded by CK_HAVE_CUBLAS.
#include "kernels_cuda.cuh"

#if defined(CK_HAVE_CUBLAS)
#include <cublas_v2.h>

#include <string>

#include "f16.cuh"

#define CK_CUBLAS(call)                                                                                  \
  do {                                                                                                   \
    const cublasStatus_t ck_st_ = (call);                                                                \
    if (ck_st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      throw ::ck::cuda::CudaError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call ": " + \
                                  cublasGetStatusName(ck_st_) + " (" + cublasGetStatusString(ck_st_) + ")"); \
  } while (0)

namespace ck::cuda {
namespace {

// f32 -> bf16, round to nearest even; NaN stays a quiet NaN.
__device__ __forceinline__ uint16_t f32_to_bf16_rne(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <bool BF16>
__global__ void to_half_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = BF16 ? f32_to_bf16_rne(x[i]) : f32_to_f16_rne(x[i]);
}

__global__ void add_bias_kernel(float* __restrict__ y, int64_t n, int32_t N, const float* __restrict__ bias) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] += bias[i % N];
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }

}  // namespace

CublasGemm::CublasGemm(cudaStream_t stream, int64_t max_x_elems) : stream_(stream), max_x_elems_(max_x_elems) {
  CK_REQUIRE(max_x_elems > 0, "CublasGemm: max_x_elems must be positive");
  cublasHandle_t h = nullptr;
  CK_CUBLAS(cublasCreate(&h));
  handle_ = h;
  try {
    CK_CUBLAS(cublasSetStream(h, stream));
    // Plain f32 math for f32 weights: no silent TF32.
    CK_CUBLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&x_half_), static_cast<size_t>(max_x_elems) * sizeof(uint16_t)));
  } catch (...) {
    cublasDestroy(h);
    handle_ = nullptr;
    throw;
  }
}

CublasGemm::~CublasGemm() {
  if (x_half_ != nullptr) cudaFree(x_half_);
  if (handle_ != nullptr) cublasDestroy(as_handle(handle_));
}

// Row-major y[T,N] = x[T,K] W[N,K]^T is, in cuBLAS's column-major terms,
// y^T[N,T] = W[N,K] x^T[K,T] with W seen as a column-major [K,N] (lda = K,
// transposed) and x as a column-major [K,T] (ldb = K), ldc = N.
void CublasGemm::matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N,
                        const float* bias, float* y) {
  CK_REQUIRE(T >= 0 && K > 0 && N > 0, "CublasGemm::matmul: bad shape");
  if (T == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  const void* b = x;
  cudaDataType_t type = CUDA_R_32F;
  if (wt != ck::DType::F32) {
    const int64_t n = int64_t{T} * K;
    CK_REQUIRE(n <= max_x_elems_, "CublasGemm::matmul: T*K exceeds the scratch bound max_x_elems");
    if (wt == ck::DType::BF16) {
      to_half_kernel<true><<<grid_for(n), 256, 0, stream_>>>(x, n, x_half_);
      type = CUDA_R_16BF;
    } else {
      to_half_kernel<false><<<grid_for(n), 256, 0, stream_>>>(x, n, x_half_);
      type = CUDA_R_16F;
    }
    CK_LAUNCH("to_half_kernel");
    b = x_half_;
  }
  CK_CUBLAS(cublasGemmEx(as_handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, type, K, b, type, K,
                         &beta, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias != nullptr) {
    const int64_t n = int64_t{T} * N;
    add_bias_kernel<<<grid_for(n), 256, 0, stream_>>>(y, n, N, bias);
    CK_LAUNCH("add_bias_kernel");
  }
}

}  // namespace ck::cuda
#endif
