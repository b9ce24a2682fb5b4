// The model-shape logic both backends share: tensor order and roles, and the
// validation of batches, page lists and pool shapes (backend.h).
#include "backend.h"

#include "cpu.h"
#include "quant.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <unordered_set>

namespace ck {

namespace {
std::string at(const char* what, size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }
}  // namespace

bool is_norm(WeightRole role) {
  switch (role) {
    case WeightRole::InputNorm:
    case WeightRole::QNorm:
    case WeightRole::KNorm:
    case WeightRole::AttnOutNorm:
    case WeightRole::MlpNorm:
    case WeightRole::MlpOutNorm:
    case WeightRole::FinalNorm: return true;
    default: return false;
  }
}

// Per layer, in this order: input norm, q, k, v, [q/k/v bias], [q/k norm], o,
// [attention output norm], MLP norm, gate, up, down, [MLP output norm].
std::vector<TensorSlot> tensor_slots(const ModelSpec& spec) {
  const int64_t H = spec.hidden, F = spec.ffn, V = spec.vocab, D = spec.head_dim;
  const int64_t qn = static_cast<int64_t>(spec.n_heads) * spec.head_dim;
  const int64_t kn = static_cast<int64_t>(spec.n_kv) * spec.head_dim;
  const int64_t vn = static_cast<int64_t>(spec.n_kv) * spec.v_head_dim;
  const int64_t on = static_cast<int64_t>(spec.n_heads) * spec.v_head_dim;
  using R = WeightRole;
  std::vector<TensorSlot> s;
  s.push_back({"model.embed_tokens.weight", {V, H}, R::Embed, -1});
  for (int32_t l = 0; l < spec.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {H}, R::InputNorm, l});
    s.push_back({p + "self_attn.q_proj.weight", {qn, H}, R::Q, l});
    s.push_back({p + "self_attn.k_proj.weight", {kn, H}, R::K, l});
    s.push_back({p + "self_attn.v_proj.weight", {vn, H}, R::V, l});
    if (spec.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", {qn}, R::QBias, l});
      s.push_back({p + "self_attn.k_proj.bias", {kn}, R::KBias, l});
      s.push_back({p + "self_attn.v_proj.bias", {vn}, R::VBias, l});
    }
    if (spec.qk_norm) {
      s.push_back({p + "self_attn.q_norm.weight", {D}, R::QNorm, l});
      s.push_back({p + "self_attn.k_norm.weight", {D}, R::KNorm, l});
    }
    s.push_back({p + "self_attn.o_proj.weight", {H, on}, R::O, l});
    if (spec.sandwich_norms) {
      s.push_back({p + "post_attention_layernorm.weight", {H}, R::AttnOutNorm, l});
      s.push_back({p + "pre_feedforward_layernorm.weight", {H}, R::MlpNorm, l});
    } else {
      s.push_back({p + "post_attention_layernorm.weight", {H}, R::MlpNorm, l});
    }
    s.push_back({p + "mlp.gate_proj.weight", {F, H}, R::Gate, l});
    s.push_back({p + "mlp.up_proj.weight", {F, H}, R::Up, l});
    s.push_back({p + "mlp.down_proj.weight", {H, F}, R::Down, l});
    if (spec.sandwich_norms) s.push_back({p + "post_feedforward_layernorm.weight", {H}, R::MlpOutNorm, l});
  }
  s.push_back({"model.norm.weight", {H}, R::FinalNorm, -1});
  if (!spec.tied_embeddings) s.push_back({"lm_head.weight", {V, H}, R::LmHead, -1});
  return s;
}

WeightPlace weight_place(const ModelSpec& spec, size_t index) {
  const TensorSlot slot = tensor_slots(spec).at(index);
  return {slot.role, slot.layer};
}

std::string validate_spec(const ModelSpec& m) {
  if (m.n_layers < 1 || m.hidden < 1 || m.n_heads < 1 || m.n_kv < 1 || m.head_dim < 2 || m.v_head_dim < 1 ||
      m.ffn < 1 || m.vocab < 1 || m.max_position < 1)
    return "spec: every size must be positive";
  if (m.n_heads % m.n_kv != 0) return "spec: nHeads must be a multiple of nKvHeads";
  if (m.head_dim % 2 != 0) return "spec: headDim must be even (rotary pairs)";
  if (!(m.rms_eps > 0.0f)) return "spec: rmsEps must be > 0";
  if (!(m.embed_scale > 0.0f) || !std::isfinite(m.embed_scale)) return "spec: embedScale must be a positive number";
  if (!(m.rope_scale > 0.0f) || !std::isfinite(m.rope_scale)) return "spec: ropeScale must be a positive number";
  if (!(m.attn_scale >= 0.0f) || !std::isfinite(m.attn_scale)) return "spec: attnScale must be >= 0 (0: 1/sqrt(headDim))";
  if (!(m.attn_softcap >= 0.0f) || !std::isfinite(m.attn_softcap)) return "spec: attnSoftcap must be >= 0 (0: none)";
  if (!(m.final_softcap >= 0.0f) || !std::isfinite(m.final_softcap)) return "spec: finalSoftcap must be >= 0 (0: none)";
  if (m.activation != Activation::Silu && m.activation != Activation::GeluTanh) return "spec: unknown activation";
  if (!m.window.empty() && m.window.size() != static_cast<size_t>(m.n_layers))
    return "spec: layerWindows has " + std::to_string(m.window.size()) + " entries, the model " +
           std::to_string(m.n_layers) + " layers";
  for (size_t l = 0; l < m.window.size(); ++l)
    if (m.window[l] < 0) return "spec: " + at("layerWindows", l) + " must be >= 0 (0: global)";
  return "";
}

std::string check_weight(const ModelSpec& spec, size_t index, DType dtype, size_t bytes) {
  const std::vector<TensorSlot> slots = tensor_slots(spec);
  if (index >= slots.size()) return "weight index " + std::to_string(index) + " is beyond the model's tensors";
  const TensorSlot& slot = slots[index];
  int64_t elems = 1;
  for (int64_t d : slot.shape) elems *= d;
  if (is_quantized(dtype)) {
    // Block formats hold the rows of a matrix the forward multiplies by (or
    // looks rows up in); norms and biases stay unquantized.
    const WeightRole role = weight_place(spec, index).role;
    const bool matrix = role == WeightRole::Embed || role == WeightRole::Q || role == WeightRole::K ||
                        role == WeightRole::V || role == WeightRole::O || role == WeightRole::Gate ||
                        role == WeightRole::Up || role == WeightRole::Down || role == WeightRole::LmHead;
    if (!matrix) return slot.name + ": a quantized type is only allowed for weight matrices";
    const int32_t block = block_shape(dtype).elems;
    if (slot.shape.back() % block != 0)
      return slot.name + ": rows of " + std::to_string(slot.shape.back()) + " elements are not a whole number of " +
             std::to_string(block) + "-element blocks";
  }
  const int64_t want = bytes_of(dtype, elems);
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

std::string make_layer_groups(const ModelSpec& spec, const std::vector<int32_t>& ids, LayerGroups* out) {
  const size_t L = static_cast<size_t>(spec.n_layers);
  LayerGroups g;
  if (ids.empty()) {
    g.group.assign(L, 0);
    for (size_t l = 0; l < L; ++l) g.slot.push_back(static_cast<int32_t>(l));
    g.n_groups = 1;
  } else {
    if (ids.size() != L)
      return "createPool: layerGroups has " + std::to_string(ids.size()) + " entries, the model has " + std::to_string(L) + " layers";
    int32_t G = 0;
    for (size_t l = 0; l < L; ++l) {
      if (ids[l] < 0 || ids[l] >= spec.n_layers)
        return "createPool: " + at("layerGroups", l) + " = " + std::to_string(ids[l]) + " is not a group id in [0, nLayers)";
      G = std::max(G, ids[l] + 1);
    }
    std::vector<int32_t> size(static_cast<size_t>(G), 0);
    g.group = ids;
    for (size_t l = 0; l < L; ++l) g.slot.push_back(size[static_cast<size_t>(ids[l])]++);
    for (int32_t i = 0; i < G; ++i)
      if (size[static_cast<size_t>(i)] == 0) return "createPool: layerGroups names no layer of group " + std::to_string(i) + " (groups are numbered 0..G-1)";
    g.n_groups = G;
  }
  for (int32_t s : g.slot) g.n_slots = std::max(g.n_slots, s + 1);
  g.widest.assign(static_cast<size_t>(g.n_groups), -1);
  for (size_t l = 0; l < L; ++l) {
    int32_t& w = g.widest[static_cast<size_t>(g.group[l])];
    const int32_t lw = spec.window_of(static_cast<int32_t>(l));
    w = w < 0 ? lw : (lw == 0 || w == 0 ? 0 : std::max(w, lw));
  }
  *out = std::move(g);
  return "";
}

int64_t page_bytes_of(const ModelSpec& spec, int32_t page_size, int32_t n_slots) {
  return static_cast<int64_t>(n_slots) * page_size * spec.n_kv * (spec.head_dim + spec.v_head_dim) *
         static_cast<int64_t>(sizeof(f16));
}

std::vector<float> per_layer_inv_freq(const ModelSpec& spec, std::vector<float> inv_freq) {
  const size_t half = static_cast<size_t>(spec.head_dim / 2);
  const size_t layers = static_cast<size_t>(spec.n_layers);
  if (inv_freq.size() == half * layers) return inv_freq;
  if (inv_freq.size() != half)
    throw std::invalid_argument("invFreq must have headDim / 2 (" + std::to_string(half) + ") or nLayers * headDim / 2 (" +
                                std::to_string(half * layers) + ") entries, got " + std::to_string(inv_freq.size()));
  std::vector<float> out;
  out.reserve(half * layers);
  for (size_t l = 0; l < layers; ++l) out.insert(out.end(), inv_freq.begin(), inv_freq.end());
  return out;
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

std::string validate_paged_batch(const StepBatch& b, const ModelSpec& spec, const LayerGroups& groups,
                                 int64_t num_pages, int32_t page_size) {
  if (num_pages <= 0) return "step: the engine has no page pool (call createPool first)";
  std::string err = validate_common(b, spec);
  if (!err.empty()) return err;
  const size_t T = b.tokens.size();
  const size_t G = static_cast<size_t>(groups.n_groups);
  if (b.slots.size() != G * T)
    return G == 1 ? "batch: slotMapping has " + std::to_string(b.slots.size()) + " rows, tokens has " + std::to_string(T)
                  : "batch: slotMapping has " + std::to_string(b.slots.size()) + " entries, want " + std::to_string(G) + " layer groups x " + std::to_string(T) + " rows";
  if (b.pt_stride < 1) return "batch: ptStride must be >= 1";
  if (b.page_table.size() % (G * static_cast<size_t>(b.pt_stride)) != 0)
    return "batch: pageTable length " + std::to_string(b.page_table.size()) + " is not a multiple of " + (G == 1 ? std::string() : std::to_string(G) + " layer groups x ") + "ptStride " + std::to_string(b.pt_stride);
  const int64_t S = static_cast<int64_t>(b.page_table.size() / (G * static_cast<size_t>(b.pt_stride)));
  const auto entry = [&](size_t g, int64_t s, int64_t i) { return b.page_table[static_cast<size_t>((static_cast<int64_t>(g) * S + s) * b.pt_stride + i)]; };
  const auto table_at = [&](size_t g, int64_t s, int64_t i) {
    return "batch: pageTable[" + (G > 1 ? std::to_string(g) + "][" : std::string()) + std::to_string(s) + "][" + std::to_string(i) + "]";
  };
  const auto slot_at = [&](size_t g, size_t t) { return G > 1 ? "slotMapping[" + std::to_string(g) + "][" + std::to_string(t) + "]" : at("slotMapping", t); };
  std::vector<int32_t> max_pos(static_cast<size_t>(S), -1);
  // Per group and sequence, the first key any of its rows reads: a group's
  // page-table entries before it may be released (negative).
  std::vector<int32_t> min_lo(G * static_cast<size_t>(S), INT32_MAX);
  std::unordered_set<int64_t> seen;
  seen.reserve(G * T * 2);
  for (size_t t = 0; t < T; ++t) {
    const int32_t s = b.row_seq[t];
    if (s < 0 || s >= S)
      return "batch: " + at("rowSeq", t) + " = " + std::to_string(s) + " is not a sequence of the page table [0, " + std::to_string(S) + ")";
    const int32_t pos = b.positions[t];
    const int32_t pidx = pos / page_size;
    if (pidx >= b.pt_stride)
      return "batch: " + at("positions", t) + " = " + std::to_string(pos) + " needs page-table entry " + std::to_string(pidx) + " but ptStride is " + std::to_string(b.pt_stride);
    max_pos[static_cast<size_t>(s)] = std::max(max_pos[static_cast<size_t>(s)], pos);
    for (size_t g = 0; g < G; ++g) {
      const int32_t widest = groups.widest[g];
      const int32_t lo = widest > 0 ? std::max(0, pos - widest + 1) : 0;
      int32_t& m = min_lo[g * static_cast<size_t>(S) + static_cast<size_t>(s)];
      m = std::min(m, lo);
      // Groups share the pool's storage slots, so no slot is written twice in a step, whatever the group.
      const int64_t slot = b.slots[g * T + t];
      if (slot < 0 || slot >= num_pages * page_size)
        return "batch: " + slot_at(g, t) + " = " + std::to_string(slot) + " is outside the pool [0, " + std::to_string(num_pages * page_size) + ")";
      if (!seen.insert(slot).second) return "batch: " + slot_at(g, t) + " = " + std::to_string(slot) + " is a duplicate slot";
    }
  }
  // Every page a row reads (entries lo/page_size..pos/page_size of its
  // sequence in each group, lo the group's widest window's first key) must
  // be a real page; then each row's slot must be where its sequence's table
  // puts its position, or attention would read a key other than the one
  // appended.
  for (size_t g = 0; g < G; ++g) {
    for (int64_t s = 0; s < S; ++s) {
      if (max_pos[static_cast<size_t>(s)] < 0) continue;
      for (int32_t i = min_lo[g * static_cast<size_t>(S) + static_cast<size_t>(s)] / page_size; i <= max_pos[static_cast<size_t>(s)] / page_size; ++i) {
        const int32_t page = entry(g, s, i);
        if (page < 0 || page >= num_pages)
          return table_at(g, s, i) + " = " + std::to_string(page) + " is not a page of the pool [0, " + std::to_string(num_pages) + ")";
      }
    }
    for (size_t t = 0; t < T; ++t) {
      const int32_t pos = b.positions[t];
      const int64_t page = entry(g, b.row_seq[t], pos / page_size);
      const int64_t want = page * page_size + pos % page_size;
      if (b.slots[g * T + t] != want)
        return "batch: " + slot_at(g, t) + " = " + std::to_string(b.slots[g * T + t]) + " disagrees with the page table, which puts sequence " + std::to_string(b.row_seq[t]) + " position " + std::to_string(pos) + " at slot " + std::to_string(want);
    }
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
