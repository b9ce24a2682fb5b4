// Element-wise ops of the model families beyond Llama (kernels_cuda.cuh):
// GeGLU, soft-capping, scaling. One thread per element, grid-stride; each
// output depends on its own inputs only.
#include <cmath>

#include "kernels_cuda.cuh"

namespace ck::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

// gelu_tanh(g) * u = g / (1 + e^(-2u)) * up with u = sqrt(2/pi) (g + 0.044715 g^3),
// as 0.5 (1 + tanh u) = sigmoid(2u) (kernels.h: geglu).
__global__ void geglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                             float* __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[e];
    const float w = fmaf(0.044715f, (g * g) * g, g);
    out[e] = g / (1.0f + expf(w * -1.5957691216057308f)) * up[e];
  }
}

__global__ void softcap_kernel(float* __restrict__ x, int64_t n, float cap) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x)
    x[e] = cap * tanhf(x[e] / cap);
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x)
    x[e] *= s;
}

}  // namespace

void geglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, cudaStream_t stream) {
  CK_REQUIRE(T >= 0 && F > 0, "geglu: bad shape");
  const int64_t n = int64_t{T} * F;
  if (n == 0) return;
  geglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, out);
  CK_LAUNCH("geglu_kernel");
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  CK_REQUIRE(n >= 0 && cap > 0.0f && std::isfinite(cap), "softcap: cap must be > 0");
  if (n == 0) return;
  softcap_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, cap);
  CK_LAUNCH("softcap_kernel");
}

void scale(float* x, int64_t n, float s, cudaStream_t stream) {
  CK_REQUIRE(n >= 0 && std::isfinite(s), "scale: bad factor");
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, s);
  CK_LAUNCH("scale_kernel");
}

}  // namespace ck::cuda
