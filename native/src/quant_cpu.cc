// Portable dequantization of the block formats (quant.h).
#include <cstring>

#include "quant.h"

namespace ck {

namespace {

void dequant_q8_0(const uint8_t* b, float* out) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
}

void dequant_q4_0(const uint8_t* b, float* out) {
  const float d = half_at(b);
  const uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>((q[j] & 0xF) - 8);
    out[j + 16] = d * static_cast<float>((q[j] >> 4) - 8);
  }
}

void dequant_q4_k(const uint8_t* b, float* out) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32, out += 64) {
    int sc, m;
    q4k_scale_min(2 * c, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    q4k_scale_min(2 * c + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      out[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      out[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q6_K, per half h of 128 elements (ql += 64, qh += 32, scales += 8 per half),
// l < 32: element l takes ql[l] low nibble and qh[l] bits 0-1, element l + 32
// ql[l + 32] low and qh bits 2-3, l + 64 ql[l] high and qh bits 4-5, l + 96
// ql[l + 32] high and qh bits 6-7; element e of the half uses scale e / 16.
void dequant_q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, out += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = (d * static_cast<float>(sc[is])) * static_cast<float>(q1);
      out[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
      out[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
      out[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
    }
  }
}

}  // namespace

void dequantize(DType t, const void* src, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(src);
  const BlockShape b = block_shape(t);
  for (int64_t i = 0; i < n; i += b.elems, p += b.bytes, out += b.elems) {
    switch (t) {
      case DType::F32: std::memcpy(out, p, 4); break;
      case DType::F16: *out = half_at(p); break;
      case DType::BF16: {
        bf16 h;
        std::memcpy(&h, p, 2);
        *out = bf16_to_f32(h);
        break;
      }
      case DType::Q8_0: dequant_q8_0(p, out); break;
      case DType::Q4_0: dequant_q4_0(p, out); break;
      case DType::Q4_K: dequant_q4_k(p, out); break;
      case DType::Q6_K: dequant_q6_k(p, out); break;
    }
  }
}

}  // namespace ck
