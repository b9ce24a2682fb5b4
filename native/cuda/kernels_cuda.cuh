// The CUDA backend: the same math and layouts as native/src/kernels.h, on
// device pointers, queued on a caller's stream. Every function validates its
// scalar arguments on the host (std::invalid_argument, nothing queued), checks
// each launch (ck::cuda::CudaError with file:line) and returns without
// synchronizing; errors inside a kernel surface at the caller's next checked
// synchronizing call.
//
// Determinism (kernels.h contract): each output element is reduced in an order
// fixed by that element's own inputs. Threads and blocks partition outputs;
// the one split reduction (split-KV attention) splits keys at fixed absolute
// positions (kAttnSplitKeys) and combines the splits in increasing order, so
// the number and bounds of splits depend only on the row's own position. So a
// row gives the same bits alone or in any batch, and a prompt the same bits
// whatever its prefill chunking. The GPU bits differ from the CPU bits (other
// summation trees); restore compares GPU with GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../src/kernels.h"
#include "check.cuh"

namespace ck::cuda {

// The numerics of these kernels as the model fingerprint's execution variant
// names them (worker/model/variant.ts adds the device architecture and the
// toolkit): K/V bytes and logits are bit-reproducible only among engines of
// one tag. Change it (bump v) with any change to the order or precision of a
// kernel's per-element arithmetic: GEMM = the tensor-core GEMM below (operands
// in the weight's 16-bit type, f32 accumulation, K in pieces of kGemmPiece);
// attention = split-KV at kAttnSplitKeys with q and p split into f16 hi + lo.
constexpr const char* kNumerics = "gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v1";

// ---- conversions (element-wise, n elements) ------------------------------
// f32 -> f16 round-to-nearest-even with the same bits as ck::f32_to_f16.
void f32_to_f16(const float* x, int64_t n, f16* out, cudaStream_t stream);
void f16_to_f32(const f16* x, int64_t n, float* out, cudaStream_t stream);
void bf16_to_f32(const bf16* x, int64_t n, float* out, cudaStream_t stream);

// ---- routed append ----------------------------------------------------------
// pages[slots[b]] = f32_to_f16(rows[b]); rows [B, row_elems], pages
// [num_slots, row_elems]. Callers validate the slots on the host first (in
// range, no slot twice) so a bad batch is refused before anything is queued;
// the kernel also skips a slot outside [0, num_slots) so a bypassed check
// cannot write outside the pool.
void routed_append(const float* rows, const int32_t* slots, int32_t B, int32_t row_elems, int64_t num_slots,
                   f16* pages, cudaStream_t stream);

// ---- attention ------------------------------------------------------------
// Split-KV (flash-decoding) attention for a ragged batch of decode and
// prefill rows. Keys of a row are cut into splits of kAttnSplitKeys at
// absolute key positions [s*kAttnSplitKeys, (s+1)*kAttnSplitKeys); pass 1
// computes per (row, kv head, split) the max m, the exp-sum l and the
// unnormalised V accumulation for every query head of the GQA group; pass 2
// combines the splits of a (row, head) in increasing s:
//   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  out = sum_s acc_s e^(m_s - M) / L.
// Pass 1 uses the tensor cores with q and p split into f16 hi + lo parts
// (22 significand bits; see attention.cu): relative error ~2e-7 against
// float64, like an f32 CUDA-core kernel. Pass 2 is launched with
// programmatic dependent launch (it waits on the device for pass 1).
// Supported shapes: head_dim and v_head_dim in {64, 128, 256}; n_heads / n_kv
// at most 16 (groups above 4 heads run as passes of 4, each re-reading K/V,
// mostly from L2); max_keys at most 2^21.
constexpr int32_t kAttnSplitKeys = 512;

// Scratch for the partial results: [T, n_heads, splits, v_head_dim + 2] f32,
// splits = ceil(max_keys / kAttnSplitKeys).
size_t attention_workspace_bytes(int32_t T, int32_t n_heads, int32_t v_head_dim, int32_t max_keys);

struct AttentionLaunch {
  int32_t max_keys;        // >= row_pos[t] + 1 for every row (the host knows it; the device is not read back)
  void* workspace;         // device memory of attention_workspace_bytes(T, n_heads, v_head_dim, max_keys)
  size_t workspace_bytes;  // checked against the need
  cudaStream_t stream;
};

// The sliding window and the score soft-cap come in `a` (kernels.h): a row
// attends keys max(0, pos - window + 1) .. pos, its splits cut at the same
// absolute positions (splits wholly before the window are skipped), each
// score soft-capped as softcap * tanhf(s / softcap).
//
// Paged: every pointer in `a` is a device pointer. A row whose row_pos + 1
// exceeds max_keys gets NaN outputs (visible, never silently truncated).
void paged_attention(const ck::PagedAttention& a, const AttentionLaunch& l);

// Contiguous oracle, the same kernels with contiguous addressing: on the GPU it
// gives the same bits as paged_attention over any page table of the same keys.
void contiguous_attention(const ck::ContiguousAttention& a, const AttentionLaunch& l);

// ---- dense ops ----------------------------------------------------------------
// Batch-invariant matmul: y[T, N] = x[T, K] · W[N, K]^T (+ bias). A row's bits
// never depend on T or on the other rows (ARCHITECTURE invariant 2).
//
// f16/bf16 weights (gemm.cu): tensor cores. x is rounded to W's type (round
// to nearest even), products are summed in f32 by mma.sync m16n8k16 along K
// in pieces of kGemmPiece, each piece its own chain from zero, the pieces
// added in increasing order, then + bias. Relative error against float64 of
// the rounded operands ~1e-6; the rounding of x adds ~2^-12 (f16) or ~2^-9
// (bf16) relative per product, ~1e-4 / ~1e-3 relative in an output (what
// cuBLAS GemmEx and a bf16 PyTorch model do too). Needs K % 8 == 0 and
// 16-byte aligned x and W. With a workspace, T <= kGemmSplitMaxT runs the
// decode tiling (one block per 64 rows of W and piece, the pieces folded by
// the last block); without one, and for larger T, the prefill tiling (128 x
// 128 blocks). Same bits either way.
//
// f32 weights: matmul_fma, each y element one f32 FMA chain over k.
constexpr int32_t kGemmPiece = 256;
constexpr int32_t kGemmSplitMaxT = 64;

// Scratch of the decode tiling: per-piece partial sums and one counter per 64
// rows of W (zero between launches). Grow-only; one per stream (the counters
// order the launches of that stream only).
class GemmWorkspace {
 public:
  GemmWorkspace() = default;
  ~GemmWorkspace();
  GemmWorkspace(const GemmWorkspace&) = delete;
  GemmWorkspace& operator=(const GemmWorkspace&) = delete;
  // Room for `partial_floats` partial sums and `counters` counters (new ones zeroed on `stream`).
  void reserve(int64_t partial_floats, int32_t counters, cudaStream_t stream);
  float* partials() const { return partials_; }
  int32_t* counters() const { return counters_; }

 private:
  float* partials_ = nullptr;
  int32_t* counters_ = nullptr;
  int64_t partial_cap_ = 0;
  int32_t counter_cap_ = 0;
};

void matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
            float* y, cudaStream_t stream, GemmWorkspace* ws = nullptr);

// Each y[t,n] one thread's f32 FMA chain over k = 0..K-1 in increasing order
// (tiles of K visited in order; a small-T kernel streams W for decode with the
// same chains), + bias. Any weight dtype; matmul uses it for f32 weights.
void matmul_fma(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
                float* y, cudaStream_t stream);

// The same product with W in a block format (native/src/quant.h), K a whole
// number of its blocks; matmul() dispatches here (native/cuda/quant.cu).
void quant_matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
                  float* y, cudaStream_t stream);
// embed() for a table in a block format, D a whole number of its blocks.
void quant_embed(const int32_t* ids, int32_t T, const void* table, ck::DType wt, int32_t D, float* out,
                 cudaStream_t stream);

// y[t,:] = x[t,:] / sqrt(mean(x[t,:]^2) + eps) * w. One block per row; the sum
// of squares is a fixed tree over a fixed block size.
void rmsnorm(const float* x, const void* w, ck::DType wt, int32_t T, int32_t D, float eps, float* y,
             cudaStream_t stream);

// In place, Hugging Face rotate_half convention (see kernels.h). pos [T] and
// inv_freq [head_dim/2] are device arrays.
void rope(float* x, int32_t T, int32_t n_heads, int32_t head_dim, const int32_t* pos, const float* inv_freq,
          cudaStream_t stream);

void swiglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, cudaStream_t stream);

// ---- family ops (family.cu): the CPU's formulas (kernels.h), element-wise ----
// out = gelu_tanh(gate) * up, gelu_tanh(g) = g / (1 + expf(-2 sqrt(2/pi) (g + 0.044715 g^3))). [T, F]
void geglu(const float* gate, const float* up, int32_t T, int32_t F, float* out, cudaStream_t stream);
// x = cap * tanhf(x / cap) over n values, cap > 0 (final logit soft-capping).
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);
// x *= s over n values (the embedding scale, LongRoPE's attention factor).
void scale(float* x, int64_t n, float s, cudaStream_t stream);

// ids must lie in [0, vocab): the binding checks them on the host; the kernel
// writes NaN for an id outside so a bypassed check is visible.
void embed(const int32_t* ids, int32_t T, const void* embedding, ck::DType wt, int32_t vocab, int32_t D,
           float* out, cudaStream_t stream);

// ---- cuBLAS GEMM (fast, NOT batch-invariant) ---------------------------------
// cuBLAS chooses its algorithm (tile shape, split-K) by problem shape, so the
// bits of a row change with T. It is the throughput path for when bit-exact
// restore is not required (e.g. a deployment that does not share pages across
// workers). Built only where cuBLAS headers exist (CK_HAVE_CUBLAS); see
// gemm_cublas.cu. For f16/bf16 weights x is first rounded to the weight type
// (cuBLAS GemmEx needs A and B of one type), so results also differ from
// matmul() by that rounding (~1e-3 relative).
// A build that finds the header but not the library defines CK_NO_CUBLAS.
#if defined(__has_include) && !defined(CK_NO_CUBLAS)
#if __has_include(<cublas_v2.h>)
#define CK_HAVE_CUBLAS 1
#endif
#endif

#if defined(CK_HAVE_CUBLAS)
class CublasGemm {
 public:
  // max_x_elems bounds the scratch that holds x converted to f16/bf16.
  CublasGemm(cudaStream_t stream, int64_t max_x_elems);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  void matmul(const float* x, int32_t T, int32_t K, const void* W, ck::DType wt, int32_t N, const float* bias,
              float* y);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
  cudaStream_t stream_;
  int64_t max_x_elems_;
  uint16_t* x_half_ = nullptr;  // [max_x_elems] device scratch
};
#endif

// ---- page transfers on a copy stream ------------------------------------------
// One worker's KV pools: per layer a K pool [num_pages, page_size, n_kv,
// head_dim] f16 and a V pool [num_pages, page_size, n_kv, v_head_dim] f16
// (device pointers). A page is the outermost index, so one page of one layer
// is one contiguous run of bytes.
struct KvPools {
  int32_t n_layers;
  int64_t num_pages;
  size_t k_page_bytes;  // page_size * n_kv * head_dim * 2
  size_t v_page_bytes;  // page_size * n_kv * v_head_dim * 2
  f16* const* k;        // host array [n_layers] of device pointers
  f16* const* v;        // host array [n_layers] of device pointers
};

// Host image of a list of pages, page-major: for page i of the list, for
// layer l: K bytes then V bytes. So bytes_per_page = n_layers * (k + v).
size_t host_bytes_per_page(const KvPools& pools);

enum class TransferState : int32_t { Pending = 0, Done = 1 };

// Bounds of PageTransfer: transfers in flight at once, and pinned bytes in all.
constexpr int32_t kMaxTransferTickets = 64;
constexpr size_t kMaxPinnedBytes = size_t{4} << 30;  // 4 GiB of page-locked host memory at most

// Downloads, uploads and page copies on a stream of their own, apart from
// compute, through a bounded pool of pinned staging slabs (slab_count *
// slab_bytes pinned bytes in total, allocated once). A transfer takes one slab;
// when none is free, begin_* returns -1 and queues nothing (the caller retries
// after polling others). Each transfer first waits (on the device, not the
// host) for the work queued on the compute stream so far, so a download reads
// what compute wrote. At most kMaxTransferTickets transfers are in flight; a
// begin_* beyond that also returns -1. Before compute may read uploaded or copied pages the
// caller must see poll() == Done (or call order_compute_after).
class PageTransfer {
 public:
  PageTransfer(const KvPools& pools, cudaStream_t compute, int32_t slab_count, size_t slab_bytes);
  ~PageTransfer();
  PageTransfer(const PageTransfer&) = delete;
  PageTransfer& operator=(const PageTransfer&) = delete;

  // Pages -> `host` (n_pages * host_bytes_per_page bytes; filled by the poll
  // that returns Done, from the slab). Returns a ticket, or -1 if no slab is free.
  int32_t begin_download(const int32_t* pages, int32_t n_pages, void* host);
  // `host` -> pages (copied into the slab now: the caller may reuse `host` on return).
  int32_t begin_upload(const int32_t* pages, int32_t n_pages, const void* host);
  // dst[i] <- src[i], all layers, K and V (copy-on-write). Uses no slab; never -1.
  int32_t begin_copy(const int32_t* src, const int32_t* dst, int32_t n_pages);

  // Non-blocking. Done releases the ticket (and its slab); a ticket is polled to
  // Done once. A failed copy throws CudaError.
  TransferState poll(int32_t ticket);
  // Makes later compute-stream work wait (on the device) for this transfer.
  void order_compute_after(int32_t ticket);
  // Blocks until every transfer has finished, then completes and releases them all.
  void drain();

  int32_t free_slabs() const;
  size_t slab_bytes() const { return slab_bytes_; }

 private:
  struct Ticket;
  int32_t acquire_ticket(bool needs_slab);
  void check_pages(const int32_t* pages, int32_t n_pages, const char* what) const;
  void follow_compute();
  void finish(int32_t ticket);
  void release_all() noexcept;

  KvPools pools_;
  std::vector<f16*> layer_k_, layer_v_;  // owned copies of the per-layer pool pointers
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // recorded on compute, waited on by copy
  int32_t slab_count_;
  size_t slab_bytes_;
  unsigned char* pinned_ = nullptr;  // slab_count * slab_bytes, cudaHostAlloc
  Ticket* tickets_ = nullptr;        // [kMaxTickets]
};

}  // namespace ck::cuda
