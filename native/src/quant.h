// Block-quantized weights: llama.cpp's GGUF tensor types Q8_0, Q4_0, Q4_K and
// Q6_K, byte for byte the layouts of ggml-common.h (little-endian):
//
//   Q8_0  32 elements in 34 B   { f16 d; i8 q[32] }                 x = d·q
//   Q4_0  32 elements in 18 B   { f16 d; u8 q[16] }                 x_j = d·((q[j] & 15) − 8), x_{j+16} = d·((q[j] >> 4) − 8)
//   Q4_K 256 elements in 144 B  { f16 d, dmin; u8 scales[12]; u8 q[128] }
//         8 groups of 32: x = (d·sc_g)·q − dmin·m_g, sc_g and m_g 6-bit (get_scale_min below);
//         chunk c (64 elements) = q[32c..32c+32) low nibbles (group 2c), then high nibbles (group 2c+1)
//   Q6_K 256 elements in 210 B  { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }
//         x = (d·sc_i)·(q − 32), q 6-bit, one int8 scale per 16 elements (layout in quant_cpu.cc)
//
// Every dequantized value is exact in f32 except Q4_K's one subtraction: d
// has 11 significant bits, so d·q (Q8_0, Q4_0: ≤ 19 bits), (d·sc)·q (Q6_K:
// ≤ 11 + 7 + 5 bits) and d·sc, dmin·m, (d·sc)·q (Q4_K: ≤ 21 bits) fit f32's 24
// bits, and Q4_K's difference of two exact values is rounded once. So every
// path (scalar, vector, CUDA) that computes these operations gets the same
// bits (the embedding rows). The matmuls take the integer path of
// quant_dot.h (activations rounded to int8 blocks), with numerics of their
// own, as fixed per output (kernels.h's determinism contract holds).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace ck {

constexpr bool is_quantized(DType t) { return static_cast<int32_t>(t) >= static_cast<int32_t>(DType::Q8_0); }

// `elems` consecutive elements of a row take `bytes` bytes ({1, 4} and {1, 2}
// for the unquantized types).
struct BlockShape {
  int32_t elems;
  int32_t bytes;
};
inline BlockShape block_shape(DType t) {
  switch (t) {
    case DType::F32: return {1, 4};
    case DType::F16:
    case DType::BF16: return {1, 2};
    case DType::Q8_0: return {32, 34};
    case DType::Q4_0: return {32, 18};
    case DType::Q4_K: return {256, 144};
    case DType::Q6_K: return {256, 210};
  }
  return {1, 4};
}

// Bytes of `elems` elements of `t`, or -1 when elems is not a whole number of blocks.
inline int64_t bytes_of(DType t, int64_t elems) {
  const BlockShape b = block_shape(t);
  if (elems < 0 || elems % b.elems != 0) return -1;
  return elems / b.elems * b.bytes;
}

// The f16 at p (any alignment) as f32.
inline float half_at(const uint8_t* p) {
  f16 h;
  __builtin_memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_K's 6-bit scale and min of group g < 8 from its 12 packed bytes s:
// groups 0-3 in the low 6 bits of bytes g and g + 4; groups 4-7 take their
// low 4 bits from byte g + 4 (scale: low nibble, min: high nibble) and their
// top 2 bits from the top bits of bytes g - 4 (scale) and g (min).
inline void q4k_scale_min(int g, const uint8_t* s, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 63;
    *m = s[g + 4] & 63;
  } else {
    *sc = (s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4);
    *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

// out[0, n) = elements [0, n) of the row data at `src` (n a whole number of
// blocks, src the start of a block), exactly (see above). Portable code; the
// vector paths produce the same bits.
void dequantize(DType t, const void* src, int64_t n, float* out);

namespace avx2 {
// dequantize() on AVX2 (the same bits); declared only where the path is built.
void dequantize(DType t, const void* src, int64_t n, float* out);
}  // namespace avx2

}  // namespace ck
