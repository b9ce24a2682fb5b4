// Error checking for every CUDA runtime call, kernel launch and cuBLAS call.
// A failure throws ck::cuda::CudaError carrying "file:line: call: reason", so
// the N-API binding can turn it into a JavaScript error and the harness can
// print it; nothing is swallowed and no exit code alone is trusted.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ck::cuda {

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + cudaGetErrorName(e) +
                  " (" + cudaGetErrorString(e) + ")");
}

[[noreturn]] inline void throw_invalid(const std::string& why, const char* file, int line) {
  throw std::invalid_argument(std::string(file) + ":" + std::to_string(line) + ": " + why);
}

}  // namespace ck::cuda

// CK_CUDA(cudaMemcpyAsync(...)): throws on anything but cudaSuccess.
#define CK_CUDA(call)                                                      \
  do {                                                                     \
    const cudaError_t ck_err_ = (call);                                    \
    if (ck_err_ != cudaSuccess) ::ck::cuda::throw_cuda(ck_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>> launch: a bad configuration (grid, shared memory) is
// reported here; an error inside the kernel surfaces at the next
// synchronizing call, itself checked with CK_CUDA.
#define CK_LAUNCH(kernel_name)                                                   \
  do {                                                                           \
    const cudaError_t ck_err_ = cudaGetLastError();                              \
    if (ck_err_ != cudaSuccess) ::ck::cuda::throw_cuda(ck_err_, "launch " kernel_name, __FILE__, __LINE__); \
  } while (0)

// CK_REQUIRE(cond, "message"): argument validation before any work is queued.
#define CK_REQUIRE(cond, msg)                                              \
  do {                                                                     \
    if (!(cond)) ::ck::cuda::throw_invalid(std::string(msg) + " (" #cond ")", __FILE__, __LINE__); \
  } while (0)
