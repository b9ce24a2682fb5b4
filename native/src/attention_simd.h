// The vector inner loops of CPU attention (`attend` in kernels_cpu.cc): the
// score dot products over a run of keys, the softmax numerator and its sum,
// and the weighted sum of a run of value rows. Like kernels_avx2.cc, every
// function carries its own target attribute and runs only after cpuid
// confirmed the ISA (cpu.h).
//
// Bit contract. Every output element is computed by one fixed sequence of
// operations that depends only on its own inputs, never on how many keys a
// call gets or where their rows are, on how many heads share a call, or on
// the batch:
// - score s[g][j]: an 8-lane f32 accumulator fma(q[i..i+8], k_j[i..i+8], acc)
//   over i ascending, the fixed horizontal sum (lanes 0+4, 1+5, 2+6, 3+7,
//   then (0+2, 1+3), then 0+1), the tail i >= d & ~7 with scalar FMA in
//   order, then the product with scale;
// - softmax: m = max_j s_j (exact, any order); p_j = exp_nonpositive(s_j - m);
//   l = 8-lane sums of p over j ascending in blocks of 8, the same horizontal
//   sum, then the tail p_j added in order;
// - value o[g][i]: fma(p[g][j], v_j[i], o[g][i]) for j ascending, starting
//   from the o the caller passes (zero before the first key).
// The AVX-512 versions pack two keys (scores) or 16 lanes (values) into one
// register but keep each lane's exact operation sequence: the same bits as
// the AVX2 versions.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace ck {

// y[i] = e^x[i] on the active ISA's attention path, for x <= 0 (the softmax
// only takes exp of s_j - max s <= 0): std::exp on the portable path,
// avx2::exp_nonpositive otherwise. A test hook for the error bound.
void attention_exp(const float* x, float* y, int64_t n);

#ifdef CK_HAVE_AVX2_PATH
namespace avx2 {

// Keys come as a table of row pointers (k[j] is key j's row, k_off the kv
// head's offset in it), so one call can span keys on different pages.
//
// s[g * s_stride + j] = scale * (q_g · k_j) for g < G, j < n, with
// q_g = q + g * q_stride and k_j = k[j] + k_off, d elements each.
void attention_scores(const float* q, int64_t q_stride, int32_t G, const f16* const* k, int64_t k_off, int32_t n,
                      int32_t d, float scale, float* s, int64_t s_stride);

// In place over s[0, L), L >= 1: s_j <- e^(s_j - max s); returns their sum l.
float softmax_numerators(float* s, int32_t L);

// o[g * o_stride + i] = fma(p[g * p_stride + j], v_j[i], o[g * o_stride + i])
// for j = 0 .. n - 1 in order, g < G, i < d, with v_j = v[j] + v_off.
void attention_values(const float* p, int64_t p_stride, int32_t G, const f16* const* v, int64_t v_off, int32_t n,
                      int32_t d, float* o, int64_t o_stride);

// y[i] = e^x[i] for x[i] <= 0: Cephes' degree-5 polynomial for e^r on
// |r| <= ln2/2 after x = n ln2 + r (n = round(x / ln2), ln2 split in two so
// r is exact to f32), scaled by 2^n. Measured error <= 2 ulp over the normal
// range (test/native/kernels.test.ts sweeps it); x = 0 gives exactly 1;
// x < ln(FLT_MIN) = -87.3365 gives 0 instead of a subnormal (a weight below
// 1.2e-38 beside the maximum's 1 cannot move an f32 sum); NaN stays NaN.
void exp_nonpositive(const float* x, float* y, int64_t n);

}  // namespace avx2

namespace avx512 {
// avx2::attention_scores and avx2::attention_values on 512-bit registers:
// the same bits.
void attention_scores(const float* q, int64_t q_stride, int32_t G, const f16* const* k, int64_t k_off, int32_t n,
                      int32_t d, float scale, float* s, int64_t s_stride);
void attention_values(const float* p, int64_t p_stride, int32_t G, const f16* const* v, int64_t v_off, int32_t n,
                      int32_t d, float* o, int64_t o_stride);
}  // namespace avx512
#endif

}  // namespace ck
