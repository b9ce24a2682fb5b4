// CPU backend internals: the instruction-set dispatch and the vector
// primitives the kernels in kernels_cpu.cc are built from. The AVX2 versions
// (kernels_avx2.cc) carry per-function target attributes, so the addon is
// built for the baseline ISA and runs anywhere; the AVX2 path is taken only
// when cpuid reports AVX2, FMA and F16C.
//
// Each primitive fixes its own reduction order, and the ISA is chosen once per
// process (set_isa is a test hook), so a given machine always computes a
// given element the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace ck {

// Avx512 is the Avx2 arithmetic, bit for bit: the batched GEMM packs two
// output columns' 8-lane accumulators into one 512-bit register (low half
// column c, high half column c + 1), so each lane still does exactly the
// 8-lane FMA sequence of the Avx2 path, at twice the FMAs per instruction.
enum class Isa : int32_t { Generic = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512 = false;  // AVX-512 F and DQ (what the column-pair GEMM uses)
};

CpuFeatures cpu_features();
Isa active_isa();
// Returns false (and changes nothing) when the CPU lacks the ISA.
bool set_isa(Isa isa);

// Asks the OS to back the 2 MiB-aligned part of [p, p + bytes) with huge
// pages (Linux transparent huge pages in "madvise" mode; a no-op elsewhere or
// when refused). Call before the memory is first touched. Decode streams
// every weight once per step, and with 4 KiB pages that stream needs a new
// TLB entry every 4 KiB.
void advise_huge_pages(void* p, size_t bytes);

// Byte size of one element of a weight dtype.
inline int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Columns [n0, n1) of y[T, N] = x[T, K] · W[N, K]^T (+ bias).
using MatmulColumns = void (*)(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias,
                               float* y, int32_t n0, int32_t n1);

namespace generic {
// s = sum_i q[i] * k[i], i ascending, one f32 accumulator.
float dot_f16(const float* q, const f16* k, int32_t n);
// acc[i] += p * v[i]
void axpy_f16(float p, const f16* v, float* acc, int32_t n);
void f32_to_f16_row(const float* x, f16* y, int32_t n);
void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                    const float* bias, float* y, int32_t n0, int32_t n1);
}  // namespace generic

#if defined(__x86_64__) || defined(__i386__)
#define CK_HAVE_AVX2_PATH 1
namespace avx2 {
void f32_to_f16_row(const float* x, f16* y, int32_t n);
// Per element: an 8-lane FMA accumulator over k ascending, a fixed horizontal
// sum, then the scalar FMA tail, whatever the tile shape, so a row's bits
// never depend on T.
void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                    const float* bias, float* y, int32_t n0, int32_t n1);
// The same, with batches of 8+ rows on 512-bit column pairs (Isa::Avx512):
// bit-identical to matmul_columns.
void matmul_columns_pairs(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                          const float* bias, float* y, int32_t n0, int32_t n1);
}  // namespace avx2
#endif

}  // namespace ck
