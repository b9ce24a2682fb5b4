// The CPU backend of the kernel contract (kernels.h). Kernels are plain loops
// over explicit shapes; the inner reductions come from the primitives in
// cpu.h, chosen once per process by ISA (attention: attention_cpu.cc). Threads
// partition outputs only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attention_simd.h"
#include "cpu.h"
#include "quant.h"
#include "quant_dot.h"
#include "thread_pool.h"

namespace ck {

// ---- conversions --------------------------------------------------------

f16 f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t exp = (u >> 23) & 0xffu;
  uint32_t mant = u & 0x7fffffu;
  if (exp == 0xffu) {
    // inf stays inf; NaN is quieted and keeps the top 9 bits of its payload
    // (what VCVTPS2PH does, so the scalar and F16C paths agree).
    return static_cast<f16>(mant != 0 ? (sign | 0x7e00u | (mant >> 13)) : (sign | 0x7c00u));
  }
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;  // f16 biased exponent
  if (e >= 31) return static_cast<f16>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    // f16 subnormal (or zero): value = r * 2^-24 with r = mant_with_implicit >> shift.
    if (e < -10) return static_cast<f16>(sign);  // below half the smallest subnormal
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t r = mant >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;  // ties to even; may carry into the smallest normal
    return static_cast<f16>(sign | r);
  }
  uint32_t r = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // a carry may reach the exponent, up to inf
  return static_cast<f16>(sign | r);
}

float f16_to_f32(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      // subnormal: value = mant * 2^-24; normalise so the leading bit is implicit.
      int32_t shifts = 0;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        ++shifts;
      }
      u = sign | (static_cast<uint32_t>(113 - shifts) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float bf16_to_f32(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- ISA dispatch ---------------------------------------------------------

CpuFeatures cpu_features() {
  CpuFeatures f;
#ifdef CK_HAVE_AVX2_PATH
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // F16C has no __builtin_cpu_supports name on every compiler: CPUID.1:ECX bit 29.
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  f.f16c = (c >> 29) & 1u;
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw");
  f.vnni = f.avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

void commit_pages(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr uintptr_t kPage = 4096;
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  const uintptr_t e = reinterpret_cast<uintptr_t>(p) + bytes;
  if (madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_WRITE) == 0) return;
#endif
  // An atomic or of zero writes without changing a byte, even if a step writes
  // the same page meanwhile.
  auto* bytes_p = static_cast<uint8_t*>(p);
  for (size_t off = 0; off < bytes; off += 4096) __atomic_fetch_or(bytes_p + off, uint8_t{0}, __ATOMIC_RELAXED);
  __atomic_fetch_or(bytes_p + bytes - 1, uint8_t{0}, __ATOMIC_RELAXED);
}

namespace {
Isa detect_isa() {
  const CpuFeatures f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return Isa::Generic;
  return f.avx512 ? Isa::Avx512 : Isa::Avx2;
}
Isa g_isa = detect_isa();
}  // namespace

Isa active_isa() { return g_isa; }

bool set_isa(Isa isa) {
  if (static_cast<int32_t>(isa) > static_cast<int32_t>(detect_isa())) return false;
  g_isa = isa;
  return true;
}

// ---- portable primitives --------------------------------------------------
// Built with -ffp-contract=off, so a * b + c is never fused behind our back.

namespace generic {

float expf_poly(float x) {
  x = x < kExpHi ? x : kExpHi;  // the operand order of MINPS / MAXPS
  x = x > kExpLo ? x : kExpLo;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpPoly[i]);
  float y = std::fma(p, r * r, r);
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

double sum_squares(const float* x, int32_t n) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8)
    for (int j = 0; j < 8; ++j) l[j] += static_cast<double>(x[i + j]) * x[i + j];
  double r = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  for (int32_t i = n8; i < n; ++i) r += static_cast<double>(x[i]) * x[i];
  return r;
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

float tanh_poly(float x) {
  if (x != x) return x;
  const float e = expf_poly(-2.0f * std::fabs(x));
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

float dot_f16(const float* q, const f16* k, int32_t n) {
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += q[i] * f16_to_f32(k[i]);
  return s;
}

void axpy_f16(float p, const f16* v, float* acc, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] += p * f16_to_f32(v[i]);
}

void f32_to_f16_row(const float* x, f16* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

inline float weight_at(const void* W, DType wt, int64_t i) {
  switch (wt) {
    case DType::F32: return static_cast<const float*>(W)[i];
    case DType::F16: return f16_to_f32(static_cast<const f16*>(W)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const bf16*>(W)[i]);
    default: break;  // block formats: quant_dot.h (matmul), dequantize (embed)
  }
  return 0.0f;
}

void matmul_columns(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                    const float* bias, float* y, int32_t n0, int32_t n1) {
  for (int32_t t = 0; t < T; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * K;
    for (int32_t n = n0; n < n1; ++n) {
      const int64_t wrow = static_cast<int64_t>(n) * K;
      float s = 0.0f;
      for (int32_t k = 0; k < K; ++k) s += xr[k] * weight_at(W, wt, wrow + k);
      if (bias != nullptr) s += bias[n];
      y[static_cast<int64_t>(t) * N + n] = s;
    }
  }
}

double exp_sum(const float* x, int32_t n, float m) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int32_t n8 = n & ~7;
  for (int32_t i = 0; i < n8; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float d = x[i + j] - m;
      l[j] += d < kExpLo ? 0.0f : expf_poly(d);
    }
  double r = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  for (int32_t i = n8; i < n; ++i) {
    const float d = x[i] - m;
    r += d < kExpLo ? 0.0f : expf_poly(d);
  }
  return r;
}

}  // namespace generic

namespace {

inline double sum_squares(const float* x, int32_t n) {
#ifdef CK_HAVE_AVX2_PATH
  if (g_isa != Isa::Generic) return avx2::sum_squares(x, n);
#endif
  return generic::sum_squares(x, n);
}

inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#ifdef CK_HAVE_AVX2_PATH
  if (g_isa != Isa::Generic) return avx2::silu_mul(gate, up, out, n);
#endif
  generic::silu_mul(gate, up, out, n);
}

inline void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
#ifdef CK_HAVE_AVX2_PATH
  if (g_isa != Isa::Generic) return avx2::gelu_mul(gate, up, out, n);
#endif
  generic::gelu_mul(gate, up, out, n);
}

inline void f32_to_f16_row(const float* x, f16* y, int32_t n) {
#ifdef CK_HAVE_AVX2_PATH
  if (g_isa != Isa::Generic) return avx2::f32_to_f16_row(x, y, n);
#endif
  generic::f32_to_f16_row(x, y, n);
}

// xp: x as PackedRows packed it for this ISA.
inline void matmul_columns(const float* x, const float* xp, int32_t T, int32_t K, const void* W, DType wt, int32_t N,
                           const float* bias, float* y, int32_t n0, int32_t n1) {
  // Block formats never get here: matmul and matmul_multi send them to the
  // integer path (quant_dot.h).
#ifdef CK_HAVE_AVX2_PATH
  if (g_isa == Isa::Avx512) return avx2::matmul_columns_pairs(x, xp, T, K, W, wt, N, bias, y, n0, n1);
  if (g_isa != Isa::Generic) return avx2::matmul_columns(x, T, K, W, wt, N, bias, y, n0, n1);
#endif
  generic::matmul_columns(x, T, K, W, wt, N, bias, y, n0, n1);
}

// x [T, K] in the layout the active ISA's batched GEMM reads (Avx512: 16-row
// blocks in row pairs), packed once per product on the calling thread
// (16 · K floats per block, against 16 · K · N multiply-adds) instead of
// once per column block by each worker. Empty on the other ISAs.
class PackedRows {
 public:
  PackedRows(const float* x, int32_t T, int32_t K) {
#ifdef CK_HAVE_AVX2_PATH
    if (g_isa != Isa::Avx512) return;
    const int64_t n = avx2::packed_rows_floats(T, K);
    if (n == 0) return;
    float* buf = aligned_floats(tl_packed_rows, static_cast<size_t>(n));
    avx2::pack_rows(x, T, K, buf);
    data_ = buf;
#else
    (void)x;
    (void)T;
    (void)K;
#endif
  }
  const float* data() const { return data_; }

 private:
  // The caller's buffer, reused across products (one product at a time per thread).
  static thread_local std::vector<float> tl_packed_rows;
  const float* data_ = nullptr;
};
thread_local std::vector<float> PackedRows::tl_packed_rows;

// Grain so a parallel_for hands each thread a few chunks of about `work`
// units of effort.
inline int64_t grain_for(int64_t items, int64_t work_per_item, int64_t target_work = 1 << 16) {
  return std::max<int64_t>(1, std::min<int64_t>(items, target_work / std::max<int64_t>(1, work_per_item)));
}

}  // namespace

// ---- routed append ----------------------------------------------------------

void routed_append(const float* rows, const int32_t* slots, int32_t B, int32_t row_elems, f16* pages,
                   ThreadPool* pool) {
  parallel_for(pool, B, grain_for(B, row_elems), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      f32_to_f16_row(rows + b * row_elems, pages + static_cast<int64_t>(slots[b]) * row_elems, row_elems);
  });
}

// ---- dense ops -------------------------------------------------------------

// Work item: a block of kMatmulBlock output columns for ALL T rows, so each
// weight row is streamed from memory once per call and reused from cache by
// every row tile (prefill and batched decode read the weights once per step).
// 48 is a multiple of both register-tile widths (3 and 8).
constexpr int32_t kMatmulBlock = 48;

// A product of few rows is bound by the weight stream (T multiply-adds per
// weight read): its column blocks are handed out in runs, kRunsPerThread
// per thread, so a thread's next block is usually the one after its own —
// the tiles prefetch the weight rows past their block, and on a core with a
// private L2 those lines help only the thread that prefetched them. Two
// runs a thread, not one, so a thread held up elsewhere costs at most a
// quarter of the product (two threads) rather than half. More rows are
// compute bound: blocks go one at a time, balancing the threads.
constexpr int64_t kRunsPerThread = 2;
constexpr int32_t kStreamBoundRows = 32;

inline int64_t column_grain(int64_t blocks, int32_t T, ThreadPool* pool) {
  if (T > kStreamBoundRows) return 1;
  const int64_t runs = (pool != nullptr ? pool->threads() : 1) * kRunsPerThread;
  return std::max<int64_t>(1, (blocks + runs - 1) / runs);
}

void matmul(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N, const float* bias,
            float* y, ThreadPool* pool) {
  const int64_t blocks = (N + kMatmulBlock - 1) / kMatmulBlock;
  if (int8_path(wt)) {
    // x quantized once for every work item and batch size (quant_dot.h).
    const Q8Rows xq = quantize_rows(x, T, K);
    parallel_for(pool, blocks, column_grain(blocks, T, pool), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int32_t n0 = static_cast<int32_t>(b * kMatmulBlock);
        int8_matmul_columns(xq, W, wt, N, bias, y, n0, std::min(N, n0 + kMatmulBlock));
      }
    });
    return;
  }
  const PackedRows xp(x, T, K);
  parallel_for(pool, blocks, column_grain(blocks, T, pool), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int32_t n0 = static_cast<int32_t>(b * kMatmulBlock);
      const int32_t n1 = std::min(N, n0 + kMatmulBlock);
      matmul_columns(x, xp.data(), T, K, W, wt, N, bias, y, n0, n1);
    }
  });
}

void matmul_multi(const float* x, int32_t T, int32_t K, const MatmulOut* outs, int32_t n_outs, ThreadPool* pool) {
  // Work items: the column blocks of every output, output after output.
  std::vector<int64_t> first(static_cast<size_t>(n_outs) + 1, 0);  // first[i] = items before output i
  for (int32_t i = 0; i < n_outs; ++i)
    first[static_cast<size_t>(i) + 1] = first[static_cast<size_t>(i)] + (outs[i].N + kMatmulBlock - 1) / kMatmulBlock;
  bool any_int8 = false;
  for (int32_t i = 0; i < n_outs; ++i) any_int8 = any_int8 || int8_path(outs[i].wt);
  const Q8Rows xq = any_int8 ? quantize_rows(x, T, K) : Q8Rows{};
  const PackedRows xp(x, T, K);
  parallel_for(pool, first.back(), column_grain(first.back(), T, pool), [&](int64_t b0, int64_t b1) {
    int32_t i = 0;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[static_cast<size_t>(i) + 1]) ++i;
      const MatmulOut& o = outs[i];
      const int32_t n0 = static_cast<int32_t>((b - first[static_cast<size_t>(i)]) * kMatmulBlock);
      if (int8_path(o.wt)) {
        int8_matmul_columns(xq, o.W, o.wt, o.N, o.bias, o.y, n0, std::min(o.N, n0 + kMatmulBlock));
        continue;
      }
      matmul_columns(x, xp.data(), T, K, o.W, o.wt, o.N, o.bias, o.y, n0, std::min(o.N, n0 + kMatmulBlock));
    }
  });
}

void rmsnorm(const float* x, const void* w, DType wt, int32_t T, int32_t D, float eps, float* y, ThreadPool* pool) {
  parallel_for(pool, T, grain_for(T, D), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = x + t * D;
      float* yr = y + t * D;
      // Sum of squares in f64 (no f32 cancellation worries for wide rows),
      // in 8 partial sums: one fixed order on every path.
      const double ss = sum_squares(xr, D);
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / D + static_cast<double>(eps)));
      switch (wt) {
        case DType::F32: {
          const float* wf = static_cast<const float*>(w);
          for (int32_t i = 0; i < D; ++i) yr[i] = (xr[i] * inv) * wf[i];
          break;
        }
        case DType::F16:
          for (int32_t i = 0; i < D; ++i) yr[i] = (xr[i] * inv) * f16_to_f32(static_cast<const f16*>(w)[i]);
          break;
        case DType::BF16: {
          const bf16* wb = static_cast<const bf16*>(w);
          for (int32_t i = 0; i < D; ++i) {
            const uint32_t u = static_cast<uint32_t>(wb[i]) << 16;  // bf16_to_f32, inlined so the loop vectorizes
            float wf;
            std::memcpy(&wf, &u, 4);
            yr[i] = (xr[i] * inv) * wf;
          }
          break;
        }
        default: break;  // norms are never quantized (check_weight)
      }
    }
  });
}

void rope(float* x, int32_t T, int32_t n_heads, int32_t head_dim, const int32_t* pos, const float* inv_freq,
          ThreadPool* pool) {
  const int32_t half = head_dim / 2;
  parallel_for(pool, T, grain_for(T, static_cast<int64_t>(n_heads) * head_dim * 4), [&](int64_t t0, int64_t t1) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      // theta = p * inv_freq[i] in f64, so large positions keep their phase;
      // cos/sin once per (row, i), shared by every head.
      for (int32_t i = 0; i < half; ++i) {
        const double theta = static_cast<double>(pos[t]) * static_cast<double>(inv_freq[i]);
        cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(theta));
        sn[static_cast<size_t>(i)] = static_cast<float>(std::sin(theta));
      }
      for (int32_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const float a = v[i];
          const float b = v[i + half];
          const float c = cs[static_cast<size_t>(i)];
          const float s = sn[static_cast<size_t>(i)];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
    }
  });
}

void swiglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, ThreadPool* pool) {
  const int64_t n = static_cast<int64_t>(T) * F;
  parallel_for(pool, n, 1 << 14, [&](int64_t i0, int64_t i1) { silu_mul(gate + i0, up + i0, out + i0, i1 - i0); });
}

void geglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, ThreadPool* pool) {
  const int64_t n = static_cast<int64_t>(T) * F;
  parallel_for(pool, n, 1 << 14, [&](int64_t i0, int64_t i1) { gelu_mul(gate + i0, up + i0, out + i0, i1 - i0); });
}

void softcap(float* x, int64_t n, float cap, ThreadPool* pool) {
  parallel_for(pool, n, 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] = cap * generic::tanh_poly(x[i] / cap);
  });
}

void embed(const int32_t* ids, int32_t T, const void* embedding, DType wt, int32_t D, float* out,
           ThreadPool* pool) {
  parallel_for(pool, T, grain_for(T, D), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (is_quantized(wt)) {
        dequantize(wt, static_cast<const uint8_t*>(embedding) + ids[t] * bytes_of(wt, D), D, out + t * D);
        continue;
      }
      const int64_t base = static_cast<int64_t>(ids[t]) * D;
      for (int32_t i = 0; i < D; ++i) out[t * D + i] = generic::weight_at(embedding, wt, base + i);
    }
  });
}

}  // namespace ck
