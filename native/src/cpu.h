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
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace ck {

// Avx512 is the Avx2 arithmetic, bit for bit: the batched GEMM packs two
// 8-lane accumulators into one 512-bit register (two rows of one column for
// 16-row blocks, two columns of one row for leftover rows), so each lane
// still does exactly the 8-lane FMA sequence of the Avx2 path, at twice the
// FMAs per instruction.
enum class Isa : int32_t { Generic = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512 = false;  // AVX-512 F, DQ and BW (what the 512-bit GEMM uses)
  bool vnni = false;    // AVX512-VNNI and AVX512-VL: the Avx512 ISA's integer dot products use vpdpbusd
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

// Faults in every page of [p, p + bytes) now, writable, leaving its contents
// as they are (Linux MADV_POPULATE_WRITE; where the kernel refuses it, an
// atomic no-op write to every 4 KiB), so the kernel's zeroing of fresh pages
// is paid here rather than by whichever step first writes there.
void commit_pages(void* p, size_t bytes);

// At least n floats of buf from a 64-byte boundary on (buf grows as needed):
// a 512-bit load from an unaligned address straddles two cache lines, which
// costs two loads (std::vector only promises 16-byte alignment).
inline float* aligned_floats(std::vector<float>& buf, size_t n) {
  if (buf.size() < n + 15) buf.resize(n + 15);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// Byte size of one element of a weight dtype.
inline int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Columns [n0, n1) of y[T, N] = x[T, K] · W[N, K]^T (+ bias).
using MatmulColumns = void (*)(const float* x, int32_t T, int32_t K, const void* W, int32_t N, const float* bias,
                               float* y, int32_t n0, int32_t n1);

// exp for SwiGLU, the same bits on every ISA path (a libm expf may differ
// between machines and has no vector twin): x clamped to [kExpLo, kExpHi],
// n = nearest-even(x · log2 e), r = x - n·ln2 (two FMAs, hi then lo part),
// exp(r) ≈ ((p(r) · r² + r) + 1) with p a degree-5 Horner polynomial in
// FMAs (the Cephes expf coefficients, ~1 ulp), times 2^n built in the
// exponent bits. kExpHi keeps n <= 127 (2^n finite); below kExpLo, 2^n would
// be subnormal.
constexpr float kExpHi = 88.0f;
constexpr float kExpLo = -87.33654f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// The GeGLU constants (kernels.h: geglu): 0.044715 and -2 sqrt(2/pi).
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluMinus2Sqrt2OverPi = -1.5957691216057308f;

namespace generic {
float expf_poly(float x);
// silu(g) = g / (1 + expf_poly(-g))
inline float silu(float g) { return g / (1.0f + expf_poly(-g)); }
// sum_i x[i]² in f64: 8 partial sums (lane i % 8) over i < n & ~7, combined
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail in order.
double sum_squares(const float* x, int32_t n);
// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// gelu_tanh(g) = g / (1 + expf_poly(fma(kGeluCubic, g*g*g, g) * kGeluMinus2Sqrt2OverPi))
inline float gelu_tanh(float g) {
  const float g3 = (g * g) * g;
  return g / (1.0f + expf_poly(std::fma(kGeluCubic, g3, g) * kGeluMinus2Sqrt2OverPi));
}
// out[i] = gelu_tanh(gate[i]) * up[i]
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);
// tanh(x) = sign(x) (1 - e) / (1 + e), e = expf_poly(-2|x|) in (0, 1]: our own
// exp, so the same bits on every machine; NaN stays NaN. Absolute error
// ~1e-7 (1 - e cancels for tiny |x|, where tanh x itself is tiny).
float tanh_poly(float x);
// s = sum_i q[i] * k[i], i ascending, one f32 accumulator.
float dot_f16(const float* q, const f16* k, int32_t n);
// acc[i] += p * v[i]
void axpy_f16(float p, const f16* v, float* acc, int32_t n);
void f32_to_f16_row(const float* x, f16* y, int32_t n);
void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                    const float* bias, float* y, int32_t n0, int32_t n1);
// sum_i e_i in f64, e_i = expf_poly(x[i] - m) (0 where x[i] - m < kExpLo, so
// -inf entries add nothing): 8 partial sums (lane i % 8) over i < n & ~7,
// combined as sum_squares combines them, then the tail in order.
double exp_sum(const float* x, int32_t n, float m);
}  // namespace generic

#if defined(__x86_64__) || defined(__i386__)
#define CK_HAVE_AVX2_PATH 1
namespace avx2 {
void f32_to_f16_row(const float* x, f16* y, int32_t n);
// generic::sum_squares, generic::silu_mul and generic::gelu_mul, bit for bit.
double sum_squares(const float* x, int32_t n);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);
// Per element: an 8-lane FMA accumulator over k ascending, a fixed horizontal
// sum, then the scalar FMA tail, whatever the tile shape, so a row's bits
// never depend on T.
void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                    const float* bias, float* y, int32_t n0, int32_t n1);
// The same on 512-bit registers (Isa::Avx512), bit-identical to
// matmul_columns: whole blocks of 16 rows on row pairs (two rows' 8-lane
// accumulators per register), leftover rows of 8+ on column pairs. xp is x
// packed by pack_rows (read for the 16-row blocks only), shared by every
// column range of one product.
void matmul_columns_pairs(const float* x, const float* xp, int32_t T, int32_t K, const void* W, DType wt,
                          int32_t N, const float* bias, float* y, int32_t n0, int32_t n1);
// Floats pack_rows writes for x [T, K]: the whole 16-row blocks, k < K & ~7
// (0 when there are none).
int64_t packed_rows_floats(int32_t T, int32_t K);
void pack_rows(const float* x, int32_t T, int32_t K, float* xp);
// generic::exp_sum, bit for bit.
double exp_sum(const float* x, int32_t n, float m);
}  // namespace avx2
#endif

}  // namespace ck
