// The engine interface both backends implement (the CPU Engine in engine.h,
// the CUDA engine in native/cuda/engine_cuda.cuh) and the N-API binding calls
// through. Pure C++ (no CUDA headers), so the binding (binding*.cc) compiles
// the same with or without the CUDA backend built in.
//
// Also the model-shape logic both backends share, so they agree to the byte:
// the canonical tensor order and each tensor's role, and the validation of
// batches and page lists (a bad one is refused with a message before anything
// is written, whatever the backend).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"

namespace ck {

// The MLP's gate activation: silu (SwiGLU) or gelu_tanh (GeGLU, kernels.h: geglu).
enum class Activation : int32_t { Silu = 0, GeluTanh = 1 };

// A decoder-only transformer of the Llama family and its relatives. The
// defaults of the family fields are the Llama forward; each family turns on
// what its modelling code does (worker/model/config.ts reads them from
// config.json). Per layer l, for rows x [T, hidden]:
//
//   h = norm(x, input_layernorm)
//   q, k, v = h W_q^T (+b), h W_k^T (+b), h W_v^T (+b)
//   q, k = norm_h(q, q_norm), norm_h(k, k_norm)     qk_norm: per head of head_dim
//   q, k = rope(q, k, pos, inv_freq[l]) * rope_scale
//   a = attention(q, k, v; window[l], attn_scale, attn_softcap)
//   o = a W_o^T;   o = norm(o, post_attention_layernorm)   (sandwich_norms)
//   x = x + o
//   h = norm(x, sandwich_norms ? pre_feedforward_layernorm : post_attention_layernorm)
//   m = (act(h W_gate^T) * h W_up^T) W_down^T;   m = norm(m, post_feedforward_layernorm)   (sandwich_norms)
//   x = x + m
// logits = norm(x, model.norm) W_lm^T, then final_softcap * tanh(logits / final_softcap).
// norm(x, w) = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) with norm_offset;
// x starts as embed_tokens[id] * embed_scale.
struct ModelSpec {
  int32_t n_layers = 0, hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0, v_head_dim = 0, ffn = 0, vocab = 0;
  float rms_eps = 1e-6f;
  bool attention_bias = false;
  bool tied_embeddings = false;
  int32_t max_position = 0;
  bool norm_offset = false;     // every RMSNorm scales by (1 + w) (Gemma); folded into the weight at load
  bool qk_norm = false;         // q_norm and k_norm [head_dim] (Qwen3, Gemma 3)
  bool sandwich_norms = false;  // norms on the attention and MLP outputs (Gemma)
  Activation activation = Activation::Silu;
  float embed_scale = 1.0f;     // Gemma: sqrt(hidden) as the embedding's dtype holds it
  float rope_scale = 1.0f;      // LongRoPE's attention_factor: cos and sin scaled, so q and k after RoPE
  float attn_scale = 0.0f;      // softmax scale; 0: 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;    // 0: none
  float final_softcap = 0.0f;   // 0: none
  // Per layer: 0 = global attention, W > 0 = sliding (the last W positions).
  // Empty = every layer global.
  std::vector<int32_t> window;

  int32_t window_of(int32_t layer) const { return window.empty() ? 0 : window[static_cast<size_t>(layer)]; }
  float softmax_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

// Why `spec` cannot run (an empty string when it can): sizes, windows,
// scales. Both backends refuse the same specs.
std::string validate_spec(const ModelSpec& spec);

// What tensor a slot of the canonical load order is. Layer-level roles carry their layer.
enum class WeightRole {
  Embed,
  InputNorm,
  Q,
  K,
  V,
  QBias,
  KBias,
  VBias,
  QNorm,
  KNorm,
  O,
  AttnOutNorm,  // sandwich: post_attention_layernorm, on the attention output
  MlpNorm,      // before the MLP: post_attention_layernorm (Llama) or pre_feedforward_layernorm (Gemma)
  Gate,
  Up,
  Down,
  MlpOutNorm,   // sandwich: post_feedforward_layernorm, on the MLP output
  FinalNorm,
  LmHead
};
bool is_norm(WeightRole role);

// One expected tensor of the canonical load order.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  WeightRole role;
  int32_t layer;  // -1 for model-level tensors
};

// A ragged batch as the engine reads it (owned copies of the caller's arrays).
struct StepBatch {
  std::vector<int32_t> tokens, positions, row_seq, slots, page_table, logit_rows;
  int32_t pt_stride = 0;  // page_table is [groups, S, pt_stride], slots [groups, T]
  int32_t T() const { return static_cast<int32_t>(tokens.size()); }
};

// Layers that share one page table (worker/model/layout.ts layerGroups, after
// vLLM's hybrid KV cache groups): layer l reads and writes its K/V through
// group[l]'s page table and slot mapping, in storage slot slot[l] of the pool
// (its rank within its group). A page id thus holds n_slots layers' rows for
// whichever group owns it, and a group whose pages fall outside its window
// can give them back while another group keeps its own.
struct LayerGroups {
  std::vector<int32_t> group, slot;
  int32_t n_groups = 0, n_slots = 0;
  // The widest window of group g's layers, 0 when one of them is global: a
  // row at pos reads none of the group's keys below max(0, pos - widest + 1).
  std::vector<int32_t> widest;
};
// ids: the group of each layer, [n_layers], groups numbered 0..G-1 each used
// (empty: one group of every layer, slot = layer). Empty string when valid.
std::string make_layer_groups(const ModelSpec& spec, const std::vector<int32_t>& ids, LayerGroups* out);

// ---- the canonical tensor order (Hugging Face names) ---------------------------
std::vector<TensorSlot> tensor_slots(const ModelSpec& spec);

// What tensor `index` of tensor_slots(spec) is.
struct WeightPlace {
  WeightRole role;
  int32_t layer;  // -1 for model-level tensors
};
// index must be < tensor_slots(spec).size().
WeightPlace weight_place(const ModelSpec& spec, size_t index);
// Empty when `bytes` of `dtype` fit slot `index`, else why not.
std::string check_weight(const ModelSpec& spec, size_t index, DType dtype, size_t bytes);

// ---- validation shared by the backends (empty string = valid) -------------------
// Paged batch against a pool of num_pages pages of page_size slots (num_pages 0: no pool)
// whose layers share page tables by `groups`.
std::string validate_paged_batch(const StepBatch& b, const ModelSpec& spec, const LayerGroups& groups,
                                 int64_t num_pages, int32_t page_size);
// Contiguous batch against a cache of ctx_seqs sequences of ctx_cap positions (ctx_seqs 0: no cache).
std::string validate_contiguous_batch(const StepBatch& b, const ModelSpec& spec, int32_t ctx_seqs, int32_t ctx_cap);
// Page ids of a transfer: each a page of the pool, none twice.
std::string validate_page_ids(const std::vector<int32_t>& ids, int64_t num_pages);
// Arguments of create_pool / create_contiguous.
std::string validate_pool_shape(int64_t num_pages, int32_t page_size);
std::string validate_contiguous_shape(const ModelSpec& spec, int32_t num_seqs, int32_t ctx_cap);
// Bytes of one page across its n_slots storage slots, K then V per slot (the transfer unit).
int64_t page_bytes_of(const ModelSpec& spec, int32_t page_size, int32_t n_slots);
// inv_freq as every layer's table, [n_layers, head_dim / 2]: a single
// [head_dim / 2] table repeated, or the per-layer tables as given. Throws
// std::invalid_argument for any other length.
std::vector<float> per_layer_inv_freq(const ModelSpec& spec, std::vector<float> inv_freq);

// Device time of the steps since profiling was enabled, by part (the CUDA
// engine's CUDA events; see native/cuda/profile.cuh). Milliseconds.
struct StepProfile {
  int64_t steps = 0;
  double step_ms = 0, gemm_ms = 0, attention_ms = 0;
};

// ---- the interface ------------------------------------------------------------------
// Calls that return std::string return "" on success, else the reason (and
// change nothing). step/step_contiguous/transfers are called only after the
// matching validate_* returned ""; a device failure inside them throws
// (std::runtime_error with the reason). The binding serializes compute calls
// on one thread and transfer calls on another.
class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  virtual const ModelSpec& spec() const = 0;
  // Host threads that compute (the CUDA engine: 1, its submitting thread).
  virtual int32_t threads() const = 0;

  std::vector<TensorSlot> tensor_slots() const { return ck::tensor_slots(spec()); }
  virtual std::string set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) = 0;

  // Paged K/V pools, one K and one V per storage slot (layer_groups(): one
  // per layer with a single group): [num_pages, page_size, n_kv, head_dim].
  // Once per engine; the shape is checked here, for every backend.
  std::string create_pool(int64_t num_pages, int32_t page_size, const std::vector<int32_t>& group_ids = {}) {
    if (has_pool()) return "createPool: the engine already has a page pool";
    std::string err = validate_pool_shape(num_pages, page_size);
    LayerGroups g;
    if (err.empty()) err = make_layer_groups(spec(), group_ids, &g);
    if (!err.empty()) return err;
    groups_ = std::move(g);
    err = allocate_pool(num_pages, page_size);
    if (!err.empty()) groups_ = LayerGroups{};
    return err;
  }
  const LayerGroups& layer_groups() const { return groups_; }
  virtual int64_t num_pages() const = 0;
  virtual int32_t page_size() const = 0;
  bool has_pool() const { return num_pages() > 0; }
  int64_t page_bytes() const { return page_bytes_of(spec(), page_size(), groups_.n_slots); }
  // Contiguous oracle cache: [num_seqs, ctx_cap, n_kv, head_dim] per layer.
  // Once per engine; the shape is checked here, for every backend.
  std::string create_contiguous(int32_t num_seqs, int32_t ctx_cap) {
    if (has_contiguous()) return "createContiguousCache: the engine already has a contiguous cache";
    const std::string err = validate_contiguous_shape(spec(), num_seqs, ctx_cap);
    return err.empty() ? allocate_contiguous(num_seqs, ctx_cap) : err;
  }
  virtual bool has_contiguous() const = 0;

  virtual std::string validate_paged(const StepBatch& b) const = 0;
  virtual std::string validate_contiguous(const StepBatch& b) const = 0;
  // Full forward; logits [logit_rows.size(), vocab] in host memory.
  virtual void step(const StepBatch& b, float* logits) = 0;
  virtual void step_contiguous(const StepBatch& b, float* logits) = 0;

  // Commits the whole page pool now (a server calls it before it says it is
  // ready): the first requests then do not pay for faulting in the pages they
  // write, and a host that cannot back the pool fails here. The CUDA pool is
  // committed (cudaMalloc, cleared) at allocation, so this is a no-op there.
  virtual void commit_pool() {}

  virtual std::string validate_pages(const std::vector<int32_t>& ids) const = 0;
  virtual void download_pages(const std::vector<int32_t>& ids, uint8_t* out) = 0;
  virtual void upload_pages(const std::vector<int32_t>& ids, const uint8_t* in) = 0;
  virtual void copy_page(int32_t src, int32_t dst) = 0;

  // Step profiling by part: "" when the backend records it, else why not.
  // Enabling clears the totals; any thread may call these.
  virtual std::string set_profiling(bool /*on*/) {
    return std::string("profiling: the ") + name() + " backend does not time its steps by part";
  }
  virtual StepProfile profile() const { return {}; }

 protected:
  // The allocations behind create_pool / create_contiguous, called with a
  // valid shape and none allocated yet; an error message, empty on success
  // (on failure nothing stays allocated).
  virtual std::string allocate_pool(int64_t num_pages, int32_t page_size) = 0;
  virtual std::string allocate_contiguous(int32_t num_seqs, int32_t ctx_cap) = 0;
  // Set by create_pool before allocate_pool (which allocates n_slots K and V pools).
  LayerGroups groups_;
};

// ---- the CUDA backend as the binding sees it --------------------------------------
// Implemented in native/cuda/engine_cuda.cu when the addon is built with
// CK_WITH_CUDA; otherwise cuda_probe() says "not built" and make_cuda_engine
// is never called.
struct CudaProbe {
  bool built = false;
  int32_t devices = 0;
  std::string reason;  // why no device is usable (empty when devices > 0)
  // What an engine's bits depend on besides the model (the execution variant,
  // worker/model/variant.ts): device 0's architecture ("sm90"; empty without
  // a device), the CUDA toolkit the backend was compiled with ("13.0"), and
  // the kernels' numerics tag (kNumerics in native/cuda/kernels_cuda.cuh).
  // toolkit and numerics are empty when the backend is not built.
  std::string arch, toolkit, numerics;
};
CudaProbe cuda_probe();
// Device copy bandwidth in GB/s, bytes read + written, of a device-to-device
// copy of `bytes` (median of 10 after 3 unmeasured; CUDA events), the
// yardstick GPU benchmarks compare themselves with (native/gpu-check.sh
// measures it the same way). Throws when no device is usable.
double cuda_copy_gb_per_s(size_t bytes);
// Throws std::runtime_error with the reason when no engine can be made (no
// device, a spec the CUDA kernels do not support). inv_freq: RoPE inverse
// frequencies, [head_dim / 2] for every layer or [n_layers, head_dim / 2].
std::unique_ptr<Backend> make_cuda_engine(const ModelSpec& spec, std::vector<float> inv_freq);

}  // namespace ck
