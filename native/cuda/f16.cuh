// Bit-level f16/bf16 conversions usable on host and device, written out
// rather than taken from cuda_fp16.h so that host and device produce the same
// bits, and so that NaN handling matches x86 F16C (VCVTPS2PH), which the CPU
// backend uses: a NaN keeps its sign and the top 10 payload bits and is made
// quiet. Everything else is IEEE 754 round-to-nearest-even: subnormals kept,
// values from 65520 up become ±inf.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CK_HD __host__ __device__ __forceinline__
#else
#define CK_HD inline
#endif

namespace ck::cuda {

CK_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

CK_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// f32 -> f16, round to nearest, ties to even.
CK_HD uint16_t f32_to_f16_rne(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  // 65520 = 0x477ff000 is the midpoint between 65504 (max finite, odd
  // mantissa) and 2^16: ties-to-even rounds it, and all above, to inf.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // normal f16 range, |x| >= 2^-14
    // Rebias the exponent (127 - 15 = 112, i.e. 0x38000000 in f32 bits) and
    // round the 13 dropped mantissa bits: add 0xfff plus the kept lsb, so a
    // tie rounds to even; a carry ripples into the exponent correctly.
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));
  }
  // Subnormal f16 (or zero): result = round(|x| / 2^-24). |x| = m * 2^(e-150)
  // with the implicit bit, so |x| / 2^-24 = m >> (126 - e).
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // |x| < 2^-25: rounds to 0 (2^-25 itself is e = 102)
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may reach 0x400, the least normal: correct
  return static_cast<uint16_t>(sign | q);
}

// f16 -> f32, exact.
CK_HD float f16_to_f32_exact(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_f32(sign | 0x7f800000u | (m << 13));  // inf / NaN (payload kept)
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_f32(sign);
  // Subnormal: m * 2^-24, exact in f32.
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// bf16 -> f32, exact: bf16 is the upper half of an f32.
CK_HD float bf16_to_f32_exact(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

}  // namespace ck::cuda
