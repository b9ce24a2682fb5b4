// The kernel contract shared by the CPU backend (native/src/*.cc) and the CUDA
// backend (native/cuda/*.cu). Both implement the same math on the same
// layouts; the CUDA versions take device pointers and a stream instead of a
// thread pool (see native/cuda/kernels_cuda.cuh).
//
// Layouts are row-major with the last index fastest. Shapes are written in
// brackets; T counts token rows in a ragged batch, S counts sequences.
//
// Determinism contract (needed for bit-exact restore, ARCHITECTURE invariant
// 2): every output element is a reduction in a FIXED order that depends only on
// that element's own inputs — never on T, S, the thread count, how rows are
// split across threads, or what else is in the batch. Threads partition
// outputs, never a reduction. So a row gives the same bits alone or in any
// batch, and a prompt gives the same bits whatever its prefill chunking.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ck {

using f16 = uint16_t;   // IEEE 754 binary16, bit pattern
using bf16 = uint16_t;  // bfloat16, bit pattern (upper half of an f32)

// F32/F16/BF16 hold one value per element; the block-quantized formats
// (llama.cpp's ggml layouts, quant.h) hold K elements of a row as K / block
// blocks and dequantize to exact f32 values (quant.h says why).
enum class DType : int32_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, Q4_0 = 4, Q4_K = 5, Q6_K = 6 };

class ThreadPool;  // defined by the CPU backend; nullptr means run on the caller's thread

// ---- conversions --------------------------------------------------------
// f32 -> f16 with round-to-nearest-even; subnormals kept, overflow -> ±inf,
// NaN stays NaN (quiet). f16/bf16 -> f32 is exact.
f16 f32_to_f16(float x);
float f16_to_f32(f16 h);
float bf16_to_f32(bf16 h);

// ---- routed append --------------------------------------------------------
// rows [B, row_elems] f32 -> pages [num_slots, row_elems] f16 where
// row_elems = n_kv * head_dim and slot = page * page_size + offset.
// pages[slots[b]] = f32_to_f16(rows[b]). Callers validate first (every slot in
// [0, num_slots), no slot twice) so a bad batch writes nothing.
void routed_append(const float* rows, const int32_t* slots, int32_t B, int32_t row_elems, f16* pages,
                   ThreadPool* pool);

// ---- attention ------------------------------------------------------------
// Causal attention for a ragged batch of rows over paged K/V of one layer.
// Row t belongs to sequence row_seq[t] and sits at absolute position
// row_pos[t] = p; it attends to that sequence's keys at positions lo..p
// inclusive (its own key must already be appended), where
//
//   lo = 0                      (window == 0: a global layer)
//   lo = max(0, p - window + 1) (a sliding layer: the last `window` positions,
//                                Hugging Face's kv_idx > q_idx - sliding_window)
//
// Key position j of sequence s lives in slot page_table[s * pt_stride + j /
// page_size] * page_size + j % page_size. Head h reads kv head h / (n_heads /
// n_kv) (GQA).
//
//   s_j        = scale * q[t,h,:]·k[j,kvh,:]
//   s_j       <- softcap * tanh(s_j / softcap)      (only when softcap > 0: Gemma 2)
//   out[t,h,:] = sum_{j=lo..p} softmax_j(s_j) v[j,kvh,:]
//
// computed in f32 in three passes (scores, then max and exp-sum, then the
// weighted sum of values with keys in increasing j), each element in an order
// fixed by its own row's keys alone (lo depends only on the row's position).
struct PagedAttention {
  const float* q;             // [T, n_heads, head_dim]
  const f16* k_pages;         // [num_pages, page_size, n_kv, head_dim]
  const f16* v_pages;         // [num_pages, page_size, n_kv, v_head_dim]
  const int32_t* page_table;  // [S, pt_stride]
  const int32_t* row_seq;     // [T]
  const int32_t* row_pos;     // [T]
  float* out;                 // [T, n_heads, v_head_dim]
  int32_t T, n_heads, n_kv, head_dim, v_head_dim, page_size, pt_stride;
  int64_t num_pages;
  float scale;
  int32_t window = 0;    // 0: every key 0..p; W > 0: keys p - W + 1 .. p
  float softcap = 0.0f;  // 0: none
};
void paged_attention(const PagedAttention& a, ThreadPool* pool);

// The correctness oracle: the same attention over a per-sequence contiguous
// cache, k [S, ctx_cap, n_kv, head_dim], v [S, ctx_cap, n_kv, v_head_dim].
struct ContiguousAttention {
  const float* q;
  const f16* k;
  const f16* v;
  const int32_t* row_seq;
  const int32_t* row_pos;
  float* out;
  int32_t T, n_heads, n_kv, head_dim, v_head_dim, ctx_cap;
  float scale;
  int32_t window = 0;
  float softcap = 0.0f;
};
void contiguous_attention(const ContiguousAttention& a, ThreadPool* pool);

// ---- dense ops -------------------------------------------------------------
// y[T, N] = x[T, K] · W[N, K]^T (+ bias[N] when bias != nullptr), W stored in
// `wt` (the Hugging Face Linear layout [out, in]); accumulation in f32 in a
// fixed order over K. Reads each weight once per call, not once per row.
void matmul(const float* x, int32_t T, int32_t K, const void* W, DType wt, int32_t N, const float* bias,
            float* y, ThreadPool* pool);

// Several products of the same x [T, K] (q/k/v, or gate/up) in ONE parallel
// region: outs[i].y [T, outs[i].N] = x · outs[i].W^T (+ outs[i].bias). Every
// element is computed exactly as matmul computes it; only the hand-offs
// between threads are fewer.
struct MatmulOut {
  const void* W;
  DType wt;
  int32_t N;
  const float* bias;  // [N] or nullptr
  float* y;
};
void matmul_multi(const float* x, int32_t T, int32_t K, const MatmulOut* outs, int32_t n_outs, ThreadPool* pool);

// y[t,:] = x[t,:] / sqrt(mean(x[t,:]^2) + eps) * w   (RMSNorm; w in `wt`;
// the CPU backend sums the squares in f64, cpu.h: sum_squares)
void rmsnorm(const float* x, const void* w, DType wt, int32_t T, int32_t D, float eps, float* y,
             ThreadPool* pool);

// In-place rotary embedding, Hugging Face Llama convention (rotate_half: pairs
// (i, i + head_dim/2)): for head vector x at position p, i < head_dim/2,
//   theta = p * inv_freq[i]
//   x'[i]       = x[i] cos(theta) - x[i+d/2] sin(theta)
//   x'[i + d/2] = x[i+d/2] cos(theta) + x[i] sin(theta)
// x [T, n_heads, head_dim]; inv_freq [head_dim/2] already includes any
// Llama-3 frequency scaling.
void rope(float* x, int32_t T, int32_t n_heads, int32_t head_dim, const int32_t* pos, const float* inv_freq,
          ThreadPool* pool);

// out[t,i] = silu(gate[t,i]) * up[t,i], silu(g) = g / (1 + exp(-g)). [T, F]
// The CPU backend's exp is its own (cpu.h: expf_poly, ~1 ulp), the same bits
// on every instruction set.
void swiglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, ThreadPool* pool);

// out[t,i] = gelu_tanh(gate[t,i]) * up[t,i] (GeGLU, Hugging Face's
// gelu_pytorch_tanh), [T, F]:
//   gelu_tanh(g) = 0.5 g (1 + tanh(u)),  u = sqrt(2/pi) (g + 0.044715 g^3)
//                = g / (1 + exp(-2u))     (as 0.5 (1 + tanh u) = sigmoid(2u))
// evaluated as g2 = g*g, g3 = g2*g, w = fma(0.044715, g3, g),
// e = expf_poly(w * -2sqrt(2/pi)), out = (g / (1 + e)) * up: the same bits on
// every instruction set, like swiglu.
void geglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, ThreadPool* pool);

// In place over n values: x <- cap * tanh(x / cap) (logit soft-capping, cap >
// 0), tanh from the CPU backend's own exp (cpu.h: tanh_poly), so the same bits
// on every instruction set.
void softcap(float* x, int64_t n, float cap, ThreadPool* pool);

// out[t,:] = embedding[ids[t], :] converted to f32. embedding [vocab, D] in `wt`.
void embed(const int32_t* ids, int32_t T, const void* embedding, DType wt, int32_t D, float* out,
           ThreadPool* pool);

}  // namespace ck
