// The integer path of quant_dot.h: activation quantization, the portable
// product (the numerics written out lane by lane) and the ISA dispatch.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu.h"
#include "quant.h"
#include "quant_dot.h"

namespace ck {

namespace {

struct Q8Buffer {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s8;
};
thread_local Q8Buffer tl_q8;

}  // namespace

namespace generic {

void quantize_rows(const float* x, int32_t T, int32_t K, int8_t* q, float* d, int32_t* s8) {
  const int64_t blocks = static_cast<int64_t>(T) * (K / 32);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int8_t* qb = q + b * 32;
    for (int j = 0; j < 32; ++j) {
      const float v = std::nearbyint(xb[j] * id);  // the default rounding: half to even
      qb[j] = static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, v)));
    }
    for (int l = 0; l < 8; ++l) s8[b * 8 + l] = 8 * (qb[4 * l] + qb[4 * l + 1] + qb[4 * l + 2] + qb[4 * l + 3]);
  }
}

namespace {

// Q6_K super-block b's sub-block s < 8 (values [32s, 32s + 32)) as q − 32,
// and the scale index of its first 16 values (the next 16 take the next).
int q6k_sub(const uint8_t* b, int s, int8_t* q) {
  const int h = s >> 2, u = s & 3;
  const uint8_t* ql = b + 64 * h + 32 * (u & 1);
  const uint8_t* qh = b + 128 + 32 * h;
  for (int l = 0; l < 32; ++l) {
    const int lo = u < 2 ? ql[l] & 0xF : ql[l] >> 4;
    q[l] = static_cast<int8_t>((lo | (((qh[l] >> (2 * u)) & 3) << 4)) - 32);
  }
  return 8 * h + 2 * u;
}

// Q6_K: lane l of sub-block s is sc_i · Σ (q − 32) · x (i: the scale of its
// 16 values), s = f16(d) · d_x (quant_dot.h's numerics with Q6_K's int scales).
void q6k_columns(const Q8Rows& x, const void* W, int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  const int32_t nb = x.K / 32;
  const int64_t rb = bytes_of(DType::Q6_K, x.K);
  int8_t wq[32];
  for (int32_t n = n0; n < n1; ++n) {
    const uint8_t* wr = static_cast<const uint8_t*>(W) + n * rb;
    for (int32_t t = 0; t < x.T; ++t) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int32_t b = 0; b < nb; ++b) {
        const uint8_t* sb = wr + (b / 8) * 210;
        const int i = q6k_sub(sb, b % 8, wq);
        const auto* sc = reinterpret_cast<const int8_t*>(sb + 192);
        const int64_t xb = static_cast<int64_t>(t) * nb + b;
        const int8_t* xq = x.q + xb * 32;
        const float s = half_at(sb + 208) * x.d[xb];
        for (int l = 0; l < 8; ++l) {
          int32_t sum = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) sum += static_cast<int32_t>(xq[j]) * wq[j];
          acc[l] = std::fma(static_cast<float>(sc[i + l / 4] * sum), s, acc[l]);
        }
      }
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6], h3 = acc[3] + acc[7];
      float v = (h0 + h2) + (h1 + h3);
      if (bias != nullptr) v += bias[n];
      y[static_cast<int64_t>(t) * N + n] = v;
    }
  }
}

// Q4_K: lane l of sub-block s is sc_s · Σ q · x, then m_s · Σ x, each with
// its f32 FMA: s1 = f16(d) · d_x, s2 = −(f16(dmin) · d_x).
void q4k_columns(const Q8Rows& x, const void* W, int32_t N, const float* bias, float* y, int32_t n0, int32_t n1) {
  const int32_t nb = x.K / 32;
  const int64_t rb = bytes_of(DType::Q4_K, x.K);
  for (int32_t n = n0; n < n1; ++n) {
    const uint8_t* wr = static_cast<const uint8_t*>(W) + n * rb;
    for (int32_t t = 0; t < x.T; ++t) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int32_t b = 0; b < nb; ++b) {
        const uint8_t* sb = wr + (b / 8) * 144;
        const int s = b % 8;
        int sc, m;
        q4k_scale_min(s, sb + 4, &sc, &m);
        const uint8_t* q = sb + 16 + 32 * (s / 2);
        const int64_t xb = static_cast<int64_t>(t) * nb + b;
        const int8_t* xq = x.q + xb * 32;
        const float s1 = half_at(sb) * x.d[xb];
        const float s2 = -(half_at(sb + 2) * x.d[xb]);
        for (int l = 0; l < 8; ++l) {
          int32_t dot = 0, sum = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) {
            const int qj = (s & 1) != 0 ? q[j] >> 4 : q[j] & 0xF;
            dot += qj * xq[j];
            sum += xq[j];
          }
          acc[l] = std::fma(static_cast<float>(sc * dot), s1, acc[l]);
          acc[l] = std::fma(static_cast<float>(m * sum), s2, acc[l]);
        }
      }
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6], h3 = acc[3] + acc[7];
      float v = (h0 + h2) + (h1 + h3);
      if (bias != nullptr) v += bias[n];
      y[static_cast<int64_t>(t) * N + n] = v;
    }
  }
}

}  // namespace

void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1) {
  if (wt == DType::Q6_K) return q6k_columns(x, W, N, bias, y, n0, n1);
  if (wt == DType::Q4_K) return q4k_columns(x, W, N, bias, y, n0, n1);
  const int32_t K = x.K, nb = K / 32;
  const int64_t rb = bytes_of(wt, K);
  const int64_t bb = wt == DType::Q8_0 ? 34 : 18;
  int8_t wq[32];
  for (int32_t n = n0; n < n1; ++n) {
    const uint8_t* wr = static_cast<const uint8_t*>(W) + n * rb;
    for (int32_t t = 0; t < x.T; ++t) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int32_t b = 0; b < nb; ++b) {
        const uint8_t* wb = wr + b * bb;
        if (wt == DType::Q8_0) {
          for (int j = 0; j < 32; ++j) wq[j] = static_cast<int8_t>(wb[2 + j]);
        } else {
          for (int j = 0; j < 16; ++j) {
            wq[j] = static_cast<int8_t>((wb[2 + j] & 0xF) - 8);
            wq[j + 16] = static_cast<int8_t>((wb[2 + j] >> 4) - 8);
          }
        }
        const int64_t xb = static_cast<int64_t>(t) * nb + b;
        const int8_t* xq = x.q + xb * 32;
        const float s = half_at(wb) * x.d[xb];
        for (int l = 0; l < 8; ++l) {
          int32_t sum = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) sum += static_cast<int32_t>(xq[j]) * wq[j];
          acc[l] = std::fma(static_cast<float>(sum), s, acc[l]);
        }
      }
      // simd::hsum's tree: (0+4, 1+5, 2+6, 3+7), then (04+26) + (15+37).
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6], h3 = acc[3] + acc[7];
      float v = (h0 + h2) + (h1 + h3);
      if (bias != nullptr) v += bias[n];
      y[static_cast<int64_t>(t) * N + n] = v;
    }
  }
}

}  // namespace generic

Q8Rows quantize_rows(const float* x, int32_t T, int32_t K) {
  const size_t n = static_cast<size_t>(T) * K, nb = n / 32;
  if (tl_q8.q.size() < n) tl_q8.q.resize(n);
  // + 8: the vector tiles load a group of 8 row scales, the last group may be short.
  if (tl_q8.d.size() < nb + 8) tl_q8.d.resize(nb + 8);
  if (tl_q8.s8.size() < nb * 8) tl_q8.s8.resize(nb * 8);
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() != Isa::Generic)
    avx2::quantize_rows(x, T, K, tl_q8.q.data(), tl_q8.d.data(), tl_q8.s8.data());
  else
#endif
    generic::quantize_rows(x, T, K, tl_q8.q.data(), tl_q8.d.data(), tl_q8.s8.data());
  return Q8Rows{tl_q8.q.data(), tl_q8.d.data(), tl_q8.s8.data(), T, K};
}

Int8Tiles int8_tiles() {
#ifdef CK_HAVE_AVX2_PATH
  static const bool vnni = cpu_features().vnni;
  if (active_isa() == Isa::Avx512 && vnni) return Int8Tiles::Avx512Vnni;
  if (active_isa() != Isa::Generic) return Int8Tiles::Avx2;
#endif
  return Int8Tiles::Generic;
}

void int8_matmul_columns(const Q8Rows& x, const void* W, DType wt, int32_t N, const float* bias, float* y,
                         int32_t n0, int32_t n1) {
  switch (int8_tiles()) {
#ifdef CK_HAVE_AVX2_PATH
    case Int8Tiles::Avx512Vnni: return avx512vnni::int8_matmul_columns(x, W, wt, N, bias, y, n0, n1);
    case Int8Tiles::Avx2: return avx2::int8_matmul_columns(x, W, wt, N, bias, y, n0, n1);
#endif
    default: return generic::int8_matmul_columns(x, W, wt, N, bias, y, n0, n1);
  }
}

}  // namespace ck
