// The CPU engine: a model's weights, its per-layer paged K/V pools and its
// contiguous oracle cache in native memory, and the full forward for a ragged
// batch. Pure C++; the N-API layer (binding.cc) owns threads and promises.
//
// Policy (which page, refcounts, generations) belongs to TypeScript; this
// class checks every index it is handed before touching memory, so a bad
// batch is refused with a message and writes nothing.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "thread_pool.h"

namespace ck {

struct ModelSpec {
  int32_t n_layers = 0, hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0, v_head_dim = 0, ffn = 0, vocab = 0;
  float rms_eps = 1e-6f;
  bool attention_bias = false;
  bool tied_embeddings = false;
  int32_t max_position = 0;
};

struct Weight {
  DType dtype = DType::F32;
  std::vector<uint8_t> bytes;
  int64_t elems = 0;
  const void* data() const { return bytes.data(); }
};

struct LayerWeights {
  Weight input_norm, q, k, v, o, post_norm, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias;  // f32 copies (empty without attention bias)
};

// One expected tensor of the canonical load order.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
};

// A page-sized buffer of f16 from calloc: the OS zero-fills lazily, so a big
// pool costs nothing until it is touched.
struct F16Buffer {
  struct Free {
    void operator()(f16* p) const { std::free(p); }
  };
  std::unique_ptr<f16, Free> ptr;
  int64_t elems = 0;
  static F16Buffer zeroed(int64_t elems);
};

// A ragged batch as the engine reads it (owned copies of the caller's arrays).
struct StepBatch {
  std::vector<int32_t> tokens, positions, row_seq, slots, page_table, logit_rows;
  int32_t pt_stride = 0;
  int32_t T() const { return static_cast<int32_t>(tokens.size()); }
};

class Engine {
 public:
  Engine(const ModelSpec& spec, std::vector<float> inv_freq, int32_t threads);

  const ModelSpec& spec() const { return spec_; }
  int32_t threads() const { return pool_.threads(); }

  // The canonical tensor order loadWeights expects (Hugging Face names).
  std::vector<TensorSlot> tensor_slots() const;
  // Copies one tensor in; returns an error message, empty on success.
  std::string set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes);

  // Paged K/V pools, one K and one V per layer: [num_pages, page_size, n_kv, head_dim].
  std::string create_pool(int64_t num_pages, int32_t page_size);
  bool has_pool() const { return num_pages_ > 0; }
  int64_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }
  // Bytes of one page across all layers, K then V per layer (the transfer unit).
  int64_t page_bytes() const;

  // Contiguous oracle cache: [num_seqs, ctx_cap, n_kv, head_dim] per layer.
  std::string create_contiguous(int32_t num_seqs, int32_t ctx_cap);

  // Empty when the batch is valid for step()/step_contiguous().
  std::string validate_paged(const StepBatch& b) const;
  std::string validate_contiguous(const StepBatch& b) const;

  // Full forward; logits [logit_rows.size(), vocab]. Call only after validation.
  void step(const StepBatch& b, float* logits);
  void step_contiguous(const StepBatch& b, float* logits);

  // Transfers (validated by validate_pages first).
  std::string validate_pages(const std::vector<int32_t>& ids) const;
  void download_pages(const std::vector<int32_t>& ids, uint8_t* out) const;
  void upload_pages(const std::vector<int32_t>& ids, const uint8_t* in);
  void copy_page(int32_t src, int32_t dst);

 private:
  enum class Mode { Paged, Contiguous };
  void forward(const StepBatch& b, Mode mode, float* logits);

  ModelSpec spec_;
  std::vector<float> inv_freq_;  // [head_dim / 2], Llama-3 scaling applied
  ThreadPool pool_;
  Weight embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;

  int64_t num_pages_ = 0;
  int32_t page_size_ = 0;
  std::vector<F16Buffer> k_pages_, v_pages_;  // per layer

  int32_t ctx_seqs_ = 0, ctx_cap_ = 0;
  std::vector<F16Buffer> k_ctx_, v_ctx_;  // per layer
};

}  // namespace ck
