// The model-shape logic both backends share: tensor order and roles, and the
// validation of batches, page lists and pool shapes (backend.h).
#include "backend.h"

#include "cpu.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace ck {

namespace {
std::string at(const char* what, size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

// Tensors per layer in the canonical order: norm, q, k, v, [q/k/v bias], o, norm, gate, up, down.
size_t per_layer(const ModelSpec& spec) { return spec.attention_bias ? 12 : 9; }
}  // namespace

std::vector<TensorSlot> tensor_slots(const ModelSpec& spec) {
  const int64_t H = spec.hidden, F = spec.ffn, V = spec.vocab;
  const int64_t qn = static_cast<int64_t>(spec.n_heads) * spec.head_dim;
  const int64_t kn = static_cast<int64_t>(spec.n_kv) * spec.head_dim;
  const int64_t vn = static_cast<int64_t>(spec.n_kv) * spec.v_head_dim;
  const int64_t on = static_cast<int64_t>(spec.n_heads) * spec.v_head_dim;
  std::vector<TensorSlot> s;
  s.push_back({"model.embed_tokens.weight", {V, H}});
  for (int32_t l = 0; l < spec.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {H}});
    s.push_back({p + "self_attn.q_proj.weight", {qn, H}});
    s.push_back({p + "self_attn.k_proj.weight", {kn, H}});
    s.push_back({p + "self_attn.v_proj.weight", {vn, H}});
    if (spec.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", {qn}});
      s.push_back({p + "self_attn.k_proj.bias", {kn}});
      s.push_back({p + "self_attn.v_proj.bias", {vn}});
    }
    s.push_back({p + "self_attn.o_proj.weight", {H, on}});
    s.push_back({p + "post_attention_layernorm.weight", {H}});
    s.push_back({p + "mlp.gate_proj.weight", {F, H}});
    s.push_back({p + "mlp.up_proj.weight", {F, H}});
    s.push_back({p + "mlp.down_proj.weight", {H, F}});
  }
  s.push_back({"model.norm.weight", {H}});
  if (!spec.tied_embeddings) s.push_back({"lm_head.weight", {V, H}});
  return s;
}

WeightPlace weight_place(const ModelSpec& spec, size_t index) {
  if (index == 0) return {WeightRole::Embed, -1};
  const size_t layer_end = 1 + per_layer(spec) * static_cast<size_t>(spec.n_layers);
  if (index == layer_end) return {WeightRole::FinalNorm, -1};
  if (index > layer_end) return {WeightRole::LmHead, -1};
  const auto layer = static_cast<int32_t>((index - 1) / per_layer(spec));
  size_t k = (index - 1) % per_layer(spec);
  if (!spec.attention_bias && k >= 4) k += 3;  // skip the bias positions
  static constexpr WeightRole kRoles[] = {WeightRole::InputNorm, WeightRole::Q,     WeightRole::K,
                                          WeightRole::V,         WeightRole::QBias, WeightRole::KBias,
                                          WeightRole::VBias,     WeightRole::O,     WeightRole::PostNorm,
                                          WeightRole::Gate,      WeightRole::Up,    WeightRole::Down};
  return {kRoles[k], layer};
}

std::string check_weight(const ModelSpec& spec, size_t index, DType dtype, size_t bytes) {
  const std::vector<TensorSlot> slots = tensor_slots(spec);
  if (index >= slots.size()) return "weight index " + std::to_string(index) + " is beyond the model's tensors";
  const TensorSlot& slot = slots[index];
  int64_t elems = 1;
  for (int64_t d : slot.shape) elems *= d;
  const int64_t want = elems * dtype_bytes(dtype);
  if (static_cast<int64_t>(bytes) != want)
    return slot.name + ": " + std::to_string(bytes) + " bytes, expected " + std::to_string(want);
  return "";
}

std::string validate_pool_shape(int64_t num_pages, int32_t page_size) {
  if (num_pages < 1 || num_pages > (int64_t{1} << 31) - 1) return "createPool: numPages must be in [1, 2^31)";
  if (page_size < 1 || page_size > 4096) return "createPool: pageSize must be in [1, 4096]";
  return "";
}

std::string validate_contiguous_shape(const ModelSpec& spec, int32_t num_seqs, int32_t ctx_cap) {
  if (num_seqs < 1) return "createContiguousCache: numSeqs must be >= 1";
  if (ctx_cap < 1 || ctx_cap > spec.max_position)
    return "createContiguousCache: ctxCap must be in [1, maxPosition = " + std::to_string(spec.max_position) + "]";
  return "";
}

int64_t page_bytes_of(const ModelSpec& spec, int32_t page_size) {
  return static_cast<int64_t>(spec.n_layers) * page_size * spec.n_kv * (spec.head_dim + spec.v_head_dim) *
         static_cast<int64_t>(sizeof(f16));
}

namespace {
// Checks shared by both paths: lengths agree, tokens, positions, logit rows.
std::string validate_common(const StepBatch& b, const ModelSpec& spec) {
  const size_t T = b.tokens.size();
  if (T == 0) return "batch: no rows (tokens is empty)";
  if (b.positions.size() != T) return "batch: positions has " + std::to_string(b.positions.size()) + " rows, tokens has " + std::to_string(T);
  if (b.row_seq.size() != T) return "batch: rowSeq has " + std::to_string(b.row_seq.size()) + " rows, tokens has " + std::to_string(T);
  for (size_t t = 0; t < T; ++t) {
    if (b.tokens[t] < 0 || b.tokens[t] >= spec.vocab)
      return "batch: " + at("tokens", t) + " = " + std::to_string(b.tokens[t]) + " is outside the vocabulary [0, " + std::to_string(spec.vocab) + ")";
    if (b.positions[t] < 0 || b.positions[t] >= spec.max_position)
      return "batch: " + at("positions", t) + " = " + std::to_string(b.positions[t]) + " is outside [0, maxPosition = " + std::to_string(spec.max_position) + ")";
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    if (b.logit_rows[i] < 0 || static_cast<size_t>(b.logit_rows[i]) >= T)
      return "batch: " + at("logitRows", i) + " = " + std::to_string(b.logit_rows[i]) + " is not a row of the batch [0, " + std::to_string(T) + ")";
  }
  return "";
}
}  // namespace

std::string validate_paged_batch(const StepBatch& b, const ModelSpec& spec, int64_t num_pages, int32_t page_size) {
  if (num_pages <= 0) return "step: the engine has no page pool (call createPool first)";
  std::string err = validate_common(b, spec);
  if (!err.empty()) return err;
  const size_t T = b.tokens.size();
  if (b.slots.size() != T) return "batch: slotMapping has " + std::to_string(b.slots.size()) + " rows, tokens has " + std::to_string(T);
  if (b.pt_stride < 1) return "batch: ptStride must be >= 1";
  if (b.page_table.size() % static_cast<size_t>(b.pt_stride) != 0)
    return "batch: pageTable length " + std::to_string(b.page_table.size()) + " is not a multiple of ptStride " + std::to_string(b.pt_stride);
  const int64_t S = static_cast<int64_t>(b.page_table.size() / static_cast<size_t>(b.pt_stride));
  std::vector<int32_t> max_pos(static_cast<size_t>(S), -1);
  std::unordered_set<int64_t> seen;
  seen.reserve(T * 2);
  for (size_t t = 0; t < T; ++t) {
    const int32_t s = b.row_seq[t];
    if (s < 0 || s >= S)
      return "batch: " + at("rowSeq", t) + " = " + std::to_string(s) + " is not a sequence of the page table [0, " + std::to_string(S) + ")";
    const int32_t pos = b.positions[t];
    const int32_t pidx = pos / page_size;
    if (pidx >= b.pt_stride)
      return "batch: " + at("positions", t) + " = " + std::to_string(pos) + " needs page-table entry " + std::to_string(pidx) + " but ptStride is " + std::to_string(b.pt_stride);
    max_pos[static_cast<size_t>(s)] = std::max(max_pos[static_cast<size_t>(s)], pos);
    const int64_t slot = b.slots[t];
    if (slot < 0 || slot >= num_pages * page_size)
      return "batch: " + at("slotMapping", t) + " = " + std::to_string(slot) + " is outside the pool [0, " + std::to_string(num_pages * page_size) + ")";
    if (!seen.insert(slot).second) return "batch: " + at("slotMapping", t) + " = " + std::to_string(slot) + " is a duplicate slot";
  }
  // Every page a row reads (entries 0..pos/page_size of its sequence) must be
  // a real page; then each row's slot must be where its sequence's table puts
  // its position, or attention would read a key other than the one appended.
  for (int64_t s = 0; s < S; ++s) {
    if (max_pos[static_cast<size_t>(s)] < 0) continue;
    for (int32_t i = 0; i <= max_pos[static_cast<size_t>(s)] / page_size; ++i) {
      const int32_t page = b.page_table[static_cast<size_t>(s * b.pt_stride + i)];
      if (page < 0 || page >= num_pages)
        return "batch: pageTable[" + std::to_string(s) + "][" + std::to_string(i) + "] = " + std::to_string(page) + " is not a page of the pool [0, " + std::to_string(num_pages) + ")";
    }
  }
  for (size_t t = 0; t < T; ++t) {
    const int32_t pos = b.positions[t];
    const int64_t page = b.page_table[static_cast<size_t>(static_cast<int64_t>(b.row_seq[t]) * b.pt_stride + pos / page_size)];
    const int64_t want = page * page_size + pos % page_size;
    if (b.slots[t] != want)
      return "batch: " + at("slotMapping", t) + " = " + std::to_string(b.slots[t]) + " disagrees with the page table, which puts sequence " + std::to_string(b.row_seq[t]) + " position " + std::to_string(pos) + " at slot " + std::to_string(want);
  }
  return "";
}

std::string validate_contiguous_batch(const StepBatch& b, const ModelSpec& spec, int32_t ctx_seqs, int32_t ctx_cap) {
  if (ctx_seqs == 0) return "stepContiguous: the engine has no contiguous cache (call createContiguousCache first)";
  std::string err = validate_common(b, spec);
  if (!err.empty()) return err;
  std::unordered_set<int64_t> seen;
  for (size_t t = 0; t < b.tokens.size(); ++t) {
    const int32_t s = b.row_seq[t];
    if (s < 0 || s >= ctx_seqs)
      return "batch: " + at("rowSeq", t) + " = " + std::to_string(s) + " is outside the cache's sequences [0, " + std::to_string(ctx_seqs) + ")";
    if (b.positions[t] >= ctx_cap)
      return "batch: " + at("positions", t) + " = " + std::to_string(b.positions[t]) + " is beyond the cache capacity " + std::to_string(ctx_cap);
    if (!seen.insert(static_cast<int64_t>(s) * ctx_cap + b.positions[t]).second)
      return "batch: " + at("positions", t) + " repeats position " + std::to_string(b.positions[t]) + " of sequence " + std::to_string(s);
  }
  return "";
}

std::string validate_page_ids(const std::vector<int32_t>& ids, int64_t num_pages) {
  if (num_pages <= 0) return "transfer: the engine has no page pool (call createPool first)";
  std::unordered_set<int32_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_pages)
      return "transfer: " + at("pageIds", i) + " = " + std::to_string(ids[i]) + " is not a page of the pool [0, " + std::to_string(num_pages) + ")";
    if (!seen.insert(ids[i]).second) return "transfer: " + at("pageIds", i) + " = " + std::to_string(ids[i]) + " appears twice";
  }
  return "";
}

#if !defined(CK_WITH_CUDA)
CudaProbe cuda_probe() {
  CudaProbe p;
  p.reason = "the addon was built without the CUDA backend (no nvcc at build time, or CONTINUUM_CUDA=off)";
  return p;
}

std::unique_ptr<Backend> make_cuda_engine(const ModelSpec&, std::vector<float>) {
  throw std::runtime_error(cuda_probe().reason);
}

double cuda_copy_gb_per_s(size_t) { throw std::runtime_error(cuda_probe().reason); }
#endif

}  // namespace ck
