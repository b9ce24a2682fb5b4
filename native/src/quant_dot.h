// Integer dot products for Q8_0, Q4_0, Q6_K and Q4_K weights (llama.cpp's design): the
// activation rows are quantized ONCE per product to blocks of 32 int8
// values with an f32 scale, and each weight block meets each activation
// block in an exact integer dot product, accumulated in f32 with the two
// scales. The products of these formats are bound by the weight stream then,
// not by converting every weight to f32.
//
// The numerics, for every batch size, row position, tile shape and ISA (so
// batch invariance and paged == contiguous hold bit for bit, kernels.h):
//
//   activation block b of a row, x[32b, 32b + 32):
//     amax = max |x_j|,  d = amax / 127,  id = amax > 0 ? 127 / amax : 0
//     q_j  = round-half-even(x_j · id)       (f32 product; |q_j| ≤ 127)
//   output y[t, n], weight values w_j = d_w · q_w,j (q_w,j ∈ [-128, 127] for
//   Q8_0, (nibble − 8) for Q4_0; Q6_K: w_j = d_w · sc_i · (q_j − 32), and
//   each lane sum below is multiplied by its 16 values' int8 scale sc_i
//   before the conversion, |·| ≤ 2^21; Q4_K: w_j = d_w · sc_s · q_j −
//   dmin_w · m_s per 32 values s, so each lane takes two FMAs, of
//   f32(sc_s · Σ q_j · q_x,j) by d_w · d_x, then of f32(m_s · Σ q_x,j) by
//   −(dmin_w · d_x)):
//     acc[l] = 0 for the 8 lanes l
//     for each block b, ascending:
//       s = d_w,b · d_x,b                                   (f32 product)
//       for l < 8: acc[l] = fma(f32(Σ_{j = 4l..4l+3} q_x,j · q_w,j), s, acc[l])
//     y = hsum(acc) (simd::hsum's tree) + bias
//
// The lane sums are exact integers (|·| ≤ 4 · 128 · 127), so every path that
// rounds the same f32 operations gets the same bits. The result differs
// from the f32 product of the dequantized weights by the activations'
// rounding, |x_j − d·q_j| ≤ d / 2 per value (the bound the tests state).
#pragma once

#include <cstdint>

#include "kernels.h"

namespace ck {

// The block formats that take the integer path: all of them.
inline bool int8_path(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q6_K || t == DType::Q4_K;
}

// x [T, K] quantized (K a multiple of 32): q [T, K]; d [T, K / 32] (+ 8
// floats of padding: the vector tiles load 8 block scales at a time); s8
// [T, K / 32, 8]: 8 · the sum of lane l's 4 values (Q4_0's −8 offset, taken
// out of the nibbles' products).
struct Q8Rows {
  const int8_t* q;
  const float* d;
  const int32_t* s8;
  int32_t T, K;
};

// Quantizes x into a buffer of the calling thread, valid until its next call.
Q8Rows quantize_rows(const float* x, int32_t T, int32_t K);

// Columns [n0, n1) of y [T, N] = x · W^T (+ bias), W of an int8_path()
// type, on the active ISA.
// The tiles int8_matmul_columns runs: the active ISA's, with AVX512-VNNI's
// dot products on an Avx512 ISA whose CPU has them (the same bits on all).
enum class Int8Tiles : int32_t { Generic = 0, Avx2 = 1, Avx512Vnni = 2 };
Int8Tiles int8_tiles();

void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1);

namespace generic {
void quantize_rows(const float* x, int32_t T, int32_t K, int8_t* q, float* d, int32_t* s8);
void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1);
}  // namespace generic

namespace avx2 {
void quantize_rows(const float* x, int32_t T, int32_t K, int8_t* q, float* d, int32_t* s8);
void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1);
}  // namespace avx2

namespace avx512vnni {
void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1);
}  // namespace avx512vnni

}  // namespace ck
