// The CPU engine: a model's weights, its per-layer paged K/V pools and its
// contiguous oracle cache in native memory, and the full forward for a ragged
// batch. Pure C++; the N-API layer (binding_engine.cc) owns threads and promises.
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

#include "backend.h"
#include "kernels.h"
#include "thread_pool.h"

namespace ck {

// The engine's weight bytes, bump-allocated (64-byte aligned) in 2 MiB-aligned
// chunks advised to huge pages before the first touch. A decode step streams
// every weight, and most tensors of a small model are under 2 MiB: allocated
// one by one, none would sit in a huge page, and the stream would need a new
// TLB entry every 4 KiB. Bound: the bytes given, plus under one chunk.
class WeightArena {
 public:
  // n bytes valid until the arena is destroyed; nullptr when out of memory.
  uint8_t* allocate(size_t n);

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<uint8_t, Free>> chunks_;
  uint8_t* next_ = nullptr;
  size_t left_ = 0;
};

struct Weight {
  DType dtype = DType::F32;
  const uint8_t* bytes = nullptr;  // in the engine's WeightArena
  int64_t elems = 0;
  const void* data() const { return bytes; }
};

struct LayerWeights {
  Weight input_norm, q, k, v, o, mlp_norm, gate, up, down;
  Weight q_norm, k_norm;               // qk_norm only
  Weight attn_out_norm, mlp_out_norm;  // sandwich_norms only
  std::vector<float> q_bias, k_bias, v_bias;  // f32 copies (empty without attention bias)
};

// A page-sized buffer of f16 from calloc: the OS zero-fills lazily, so a big
// pool costs nothing until it is touched (or committed: Engine::commit_pool);
// touched memory comes in 2 MiB transparent huge pages where the kernel allows
// (advise_huge_pages), so a pool commits up to 2 MiB per touched region, not
// 4 KiB.
struct F16Buffer {
  struct Free {
    void operator()(f16* p) const { std::free(p); }
  };
  std::unique_ptr<f16, Free> ptr;
  int64_t elems = 0;
  static F16Buffer zeroed(int64_t elems);
};

class Engine final : public Backend {
 public:
  // inv_freq: [head_dim / 2] for every layer, or [n_layers, head_dim / 2].
  Engine(const ModelSpec& spec, std::vector<float> inv_freq, int32_t threads);

  const char* name() const override { return "cpu"; }
  const ModelSpec& spec() const override { return spec_; }
  int32_t threads() const override { return pool_.threads(); }

  // Copies one tensor in (tensor_slots() order); returns an error message, empty on success.
  std::string set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) override;

  int64_t num_pages() const override { return num_pages_; }
  int32_t page_size() const override { return page_size_; }
  bool has_contiguous() const override { return ctx_seqs_ > 0; }
  // Faults in every K and V page (commit_pages).
  void commit_pool() override;

  // Empty when the batch is valid for step()/step_contiguous().
  std::string validate_paged(const StepBatch& b) const override;
  std::string validate_contiguous(const StepBatch& b) const override;

  // Full forward; logits [logit_rows.size(), vocab]. Call only after validation.
  void step(const StepBatch& b, float* logits) override;
  void step_contiguous(const StepBatch& b, float* logits) override;

  // Transfers (validated by validate_pages first).
  std::string validate_pages(const std::vector<int32_t>& ids) const override;
  void download_pages(const std::vector<int32_t>& ids, uint8_t* out) override;
  void upload_pages(const std::vector<int32_t>& ids, const uint8_t* in) override;
  void copy_page(int32_t src, int32_t dst) override;

 protected:
  std::string allocate_pool(int64_t num_pages, int32_t page_size) override;
  std::string allocate_contiguous(int32_t num_seqs, int32_t ctx_cap) override;

 private:
  enum class Mode { Paged, Contiguous };
  void forward(const StepBatch& b, Mode mode, float* logits);

  ModelSpec spec_;
  std::vector<float> inv_freq_;  // [n_layers, head_dim / 2], any RoPE scaling applied
  ThreadPool pool_;
  WeightArena arena_;  // owns every Weight's bytes
  Weight embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;

  int64_t num_pages_ = 0;
  int32_t page_size_ = 0;
  std::vector<F16Buffer> k_pages_, v_pages_;  // per layer

  int32_t ctx_seqs_ = 0, ctx_cap_ = 0;
  std::vector<F16Buffer> k_ctx_, v_ctx_;  // per layer

  // forward()'s activations, kept between steps (steps run one at a time on
  // the engine's queue): a batch-16 step's gate/up rows are 128 KiB each,
  // which malloc maps fresh and the kernel zero-fills on every step. They
  // hold as much as the largest step so far needed; every op writes its
  // output rows before any are read.
  struct Activations {
    std::vector<float> x, h, o, q, k, v, attn, g, u, sel, nsel;
  };
  Activations act_;
};

}  // namespace ck
