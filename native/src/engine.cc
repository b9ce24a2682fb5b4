#include "engine.h"

#include "cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

namespace ck {

namespace {
std::string at(const char* what, size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }
}  // namespace

F16Buffer F16Buffer::zeroed(int64_t elems) {
  F16Buffer b;
  b.elems = elems;
  b.ptr.reset(static_cast<f16*>(std::calloc(static_cast<size_t>(std::max<int64_t>(1, elems)), sizeof(f16))));
  return b;
}

Engine::Engine(const ModelSpec& spec, std::vector<float> inv_freq, int32_t threads)
    : spec_(spec), inv_freq_(std::move(inv_freq)), pool_(threads, /*background=*/true), layers_(static_cast<size_t>(spec.n_layers)) {}

std::vector<TensorSlot> Engine::tensor_slots() const {
  const int64_t H = spec_.hidden, F = spec_.ffn, V = spec_.vocab;
  const int64_t qn = static_cast<int64_t>(spec_.n_heads) * spec_.head_dim;
  const int64_t kn = static_cast<int64_t>(spec_.n_kv) * spec_.head_dim;
  const int64_t vn = static_cast<int64_t>(spec_.n_kv) * spec_.v_head_dim;
  const int64_t on = static_cast<int64_t>(spec_.n_heads) * spec_.v_head_dim;
  std::vector<TensorSlot> s;
  s.push_back({"model.embed_tokens.weight", {V, H}});
  for (int32_t l = 0; l < spec_.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {H}});
    s.push_back({p + "self_attn.q_proj.weight", {qn, H}});
    s.push_back({p + "self_attn.k_proj.weight", {kn, H}});
    s.push_back({p + "self_attn.v_proj.weight", {vn, H}});
    if (spec_.attention_bias) {
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
  if (!spec_.tied_embeddings) s.push_back({"lm_head.weight", {V, H}});
  return s;
}

std::string Engine::set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) {
  const std::vector<TensorSlot> slots = tensor_slots();
  if (index >= slots.size()) return "weight index " + std::to_string(index) + " is beyond the model's tensors";
  const TensorSlot& slot = slots[index];
  int64_t elems = 1;
  for (int64_t d : slot.shape) elems *= d;
  const int64_t want = elems * dtype_bytes(dtype);
  if (static_cast<int64_t>(bytes) != want)
    return slot.name + ": " + std::to_string(bytes) + " bytes, expected " + std::to_string(want);
  Weight w;
  w.dtype = dtype;
  w.elems = elems;
  w.bytes.reserve(bytes);
  advise_huge_pages(w.bytes.data(), bytes);
  w.bytes.assign(data, data + bytes);

  auto to_f32 = [&](std::vector<float>& out) {
    out.resize(static_cast<size_t>(elems));
    for (int64_t i = 0; i < elems; ++i) {
      switch (dtype) {
        case DType::F32: std::memcpy(&out[static_cast<size_t>(i)], data + 4 * i, 4); break;
        case DType::F16: out[static_cast<size_t>(i)] = f16_to_f32(reinterpret_cast<const f16*>(data)[i]); break;
        case DType::BF16: out[static_cast<size_t>(i)] = bf16_to_f32(reinterpret_cast<const bf16*>(data)[i]); break;
      }
    }
  };
  if (index == 0) {
    embed_ = std::move(w);
    return "";
  }
  const size_t per_layer = spec_.attention_bias ? 12 : 9;
  const size_t layer_end = 1 + per_layer * static_cast<size_t>(spec_.n_layers);
  if (index < layer_end) {
    LayerWeights& L = layers_[(index - 1) / per_layer];
    size_t k = (index - 1) % per_layer;
    if (!spec_.attention_bias && k >= 4) k += 3;  // skip the bias positions
    switch (k) {
      case 0: L.input_norm = std::move(w); break;
      case 1: L.q = std::move(w); break;
      case 2: L.k = std::move(w); break;
      case 3: L.v = std::move(w); break;
      case 4: to_f32(L.q_bias); break;
      case 5: to_f32(L.k_bias); break;
      case 6: to_f32(L.v_bias); break;
      case 7: L.o = std::move(w); break;
      case 8: L.post_norm = std::move(w); break;
      case 9: L.gate = std::move(w); break;
      case 10: L.up = std::move(w); break;
      default: L.down = std::move(w); break;
    }
    return "";
  }
  if (index == layer_end) {
    final_norm_ = std::move(w);
  } else {
    lm_head_ = std::move(w);
  }
  return "";
}

std::string Engine::create_pool(int64_t num_pages, int32_t page_size) {
  if (has_pool()) return "createPool: the engine already has a page pool";
  if (num_pages < 1 || num_pages > (int64_t{1} << 31) - 1) return "createPool: numPages must be in [1, 2^31)";
  if (page_size < 1 || page_size > 4096) return "createPool: pageSize must be in [1, 4096]";
  const int64_t slots = num_pages * page_size;
  for (int32_t l = 0; l < spec_.n_layers; ++l) {
    k_pages_.push_back(F16Buffer::zeroed(slots * spec_.n_kv * spec_.head_dim));
    v_pages_.push_back(F16Buffer::zeroed(slots * spec_.n_kv * spec_.v_head_dim));
    if (!k_pages_.back().ptr || !v_pages_.back().ptr) {
      k_pages_.clear();
      v_pages_.clear();
      return "createPool: out of memory for " + std::to_string(num_pages) + " pages";
    }
  }
  num_pages_ = num_pages;
  page_size_ = page_size;
  return "";
}

int64_t Engine::page_bytes() const {
  return static_cast<int64_t>(spec_.n_layers) * page_size_ * spec_.n_kv * (spec_.head_dim + spec_.v_head_dim) *
         static_cast<int64_t>(sizeof(f16));
}

std::string Engine::create_contiguous(int32_t num_seqs, int32_t ctx_cap) {
  if (ctx_seqs_ > 0) return "createContiguousCache: the engine already has a contiguous cache";
  if (num_seqs < 1) return "createContiguousCache: numSeqs must be >= 1";
  if (ctx_cap < 1 || ctx_cap > spec_.max_position)
    return "createContiguousCache: ctxCap must be in [1, maxPosition = " + std::to_string(spec_.max_position) + "]";
  const int64_t slots = static_cast<int64_t>(num_seqs) * ctx_cap;
  for (int32_t l = 0; l < spec_.n_layers; ++l) {
    k_ctx_.push_back(F16Buffer::zeroed(slots * spec_.n_kv * spec_.head_dim));
    v_ctx_.push_back(F16Buffer::zeroed(slots * spec_.n_kv * spec_.v_head_dim));
    if (!k_ctx_.back().ptr || !v_ctx_.back().ptr) {
      k_ctx_.clear();
      v_ctx_.clear();
      return "createContiguousCache: out of memory";
    }
  }
  ctx_seqs_ = num_seqs;
  ctx_cap_ = ctx_cap;
  return "";
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

std::string Engine::validate_paged(const StepBatch& b) const {
  if (!has_pool()) return "step: the engine has no page pool (call createPool first)";
  std::string err = validate_common(b, spec_);
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
    const int32_t pidx = pos / page_size_;
    if (pidx >= b.pt_stride)
      return "batch: " + at("positions", t) + " = " + std::to_string(pos) + " needs page-table entry " + std::to_string(pidx) + " but ptStride is " + std::to_string(b.pt_stride);
    max_pos[static_cast<size_t>(s)] = std::max(max_pos[static_cast<size_t>(s)], pos);
    const int64_t slot = b.slots[t];
    if (slot < 0 || slot >= num_pages_ * page_size_)
      return "batch: " + at("slotMapping", t) + " = " + std::to_string(slot) + " is outside the pool [0, " + std::to_string(num_pages_ * page_size_) + ")";
    if (!seen.insert(slot).second) return "batch: " + at("slotMapping", t) + " = " + std::to_string(slot) + " is a duplicate slot";
  }
  // Every page a row reads (entries 0..pos/page_size of its sequence) must be
  // a real page; then each row's slot must be where its sequence's table puts
  // its position, or attention would read a key other than the one appended.
  for (int64_t s = 0; s < S; ++s) {
    if (max_pos[static_cast<size_t>(s)] < 0) continue;
    for (int32_t i = 0; i <= max_pos[static_cast<size_t>(s)] / page_size_; ++i) {
      const int32_t page = b.page_table[static_cast<size_t>(s * b.pt_stride + i)];
      if (page < 0 || page >= num_pages_)
        return "batch: pageTable[" + std::to_string(s) + "][" + std::to_string(i) + "] = " + std::to_string(page) + " is not a page of the pool [0, " + std::to_string(num_pages_) + ")";
    }
  }
  for (size_t t = 0; t < T; ++t) {
    const int32_t pos = b.positions[t];
    const int64_t page = b.page_table[static_cast<size_t>(static_cast<int64_t>(b.row_seq[t]) * b.pt_stride + pos / page_size_)];
    const int64_t want = page * page_size_ + pos % page_size_;
    if (b.slots[t] != want)
      return "batch: " + at("slotMapping", t) + " = " + std::to_string(b.slots[t]) + " disagrees with the page table, which puts sequence " + std::to_string(b.row_seq[t]) + " position " + std::to_string(pos) + " at slot " + std::to_string(want);
  }
  return "";
}

std::string Engine::validate_contiguous(const StepBatch& b) const {
  if (ctx_seqs_ == 0) return "stepContiguous: the engine has no contiguous cache (call createContiguousCache first)";
  std::string err = validate_common(b, spec_);
  if (!err.empty()) return err;
  std::unordered_set<int64_t> seen;
  for (size_t t = 0; t < b.tokens.size(); ++t) {
    const int32_t s = b.row_seq[t];
    if (s < 0 || s >= ctx_seqs_)
      return "batch: " + at("rowSeq", t) + " = " + std::to_string(s) + " is outside the cache's sequences [0, " + std::to_string(ctx_seqs_) + ")";
    if (b.positions[t] >= ctx_cap_)
      return "batch: " + at("positions", t) + " = " + std::to_string(b.positions[t]) + " is beyond the cache capacity " + std::to_string(ctx_cap_);
    if (!seen.insert(static_cast<int64_t>(s) * ctx_cap_ + b.positions[t]).second)
      return "batch: " + at("positions", t) + " repeats position " + std::to_string(b.positions[t]) + " of sequence " + std::to_string(s);
  }
  return "";
}

void Engine::step(const StepBatch& b, float* logits) { forward(b, Mode::Paged, logits); }
void Engine::step_contiguous(const StepBatch& b, float* logits) { forward(b, Mode::Contiguous, logits); }

void Engine::forward(const StepBatch& b, Mode mode, float* logits) {
  const ModelSpec& m = spec_;
  const int32_t T = b.T();
  const int64_t H = m.hidden, F = m.ffn;
  const int32_t qn = m.n_heads * m.head_dim, kn = m.n_kv * m.head_dim, vn = m.n_kv * m.v_head_dim;
  const int32_t on = m.n_heads * m.v_head_dim;
  std::vector<float> x(static_cast<size_t>(T * H)), h(static_cast<size_t>(T * H)), o(static_cast<size_t>(T * H));
  std::vector<float> q(static_cast<size_t>(T) * qn), k(static_cast<size_t>(T) * kn), v(static_cast<size_t>(T) * vn);
  std::vector<float> attn(static_cast<size_t>(T) * on);
  std::vector<float> g(static_cast<size_t>(T * F)), u(static_cast<size_t>(T * F));
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));

  // Contiguous rows land at slot seq * ctx_cap + pos of the per-layer cache.
  std::vector<int32_t> ctx_slots;
  if (mode == Mode::Contiguous) {
    ctx_slots.resize(static_cast<size_t>(T));
    for (int32_t t = 0; t < T; ++t) ctx_slots[static_cast<size_t>(t)] = b.row_seq[static_cast<size_t>(t)] * ctx_cap_ + b.positions[static_cast<size_t>(t)];
  }
  const int32_t* slots = mode == Mode::Paged ? b.slots.data() : ctx_slots.data();

  embed(b.tokens.data(), T, embed_.data(), embed_.dtype, m.hidden, x.data(), &pool_);
  for (int32_t l = 0; l < m.n_layers; ++l) {
    const LayerWeights& L = layers_[static_cast<size_t>(l)];
    f16* kc = mode == Mode::Paged ? k_pages_[static_cast<size_t>(l)].ptr.get() : k_ctx_[static_cast<size_t>(l)].ptr.get();
    f16* vc = mode == Mode::Paged ? v_pages_[static_cast<size_t>(l)].ptr.get() : v_ctx_[static_cast<size_t>(l)].ptr.get();
    // attention block: x += o_proj(attn(rope(q), rope(k), v)) of rmsnorm(x)
    rmsnorm(x.data(), L.input_norm.data(), L.input_norm.dtype, T, m.hidden, m.rms_eps, h.data(), &pool_);
    const MatmulOut qkv[3] = {
        {L.q.data(), L.q.dtype, qn, L.q_bias.empty() ? nullptr : L.q_bias.data(), q.data()},
        {L.k.data(), L.k.dtype, kn, L.k_bias.empty() ? nullptr : L.k_bias.data(), k.data()},
        {L.v.data(), L.v.dtype, vn, L.v_bias.empty() ? nullptr : L.v_bias.data(), v.data()}};
    matmul_multi(h.data(), T, m.hidden, qkv, 3, &pool_);
    rope(q.data(), T, m.n_heads, m.head_dim, b.positions.data(), inv_freq_.data(), &pool_);
    rope(k.data(), T, m.n_kv, m.head_dim, b.positions.data(), inv_freq_.data(), &pool_);
    routed_append(k.data(), slots, T, kn, kc, &pool_);
    routed_append(v.data(), slots, T, vn, vc, &pool_);
    if (mode == Mode::Paged) {
      PagedAttention a{q.data(), kc, vc, b.page_table.data(), b.row_seq.data(), b.positions.data(), attn.data(),
                       T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, page_size_, b.pt_stride, num_pages_, scale};
      paged_attention(a, &pool_);
    } else {
      ContiguousAttention a{q.data(), kc, vc, b.row_seq.data(), b.positions.data(), attn.data(),
                            T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, ctx_cap_, scale};
      contiguous_attention(a, &pool_);
    }
    matmul(attn.data(), T, on, L.o.data(), L.o.dtype, m.hidden, nullptr, o.data(), &pool_);
    for (int64_t i = 0; i < T * H; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
    // MLP block: x += down(swiglu(gate(h), up(h))) of h = rmsnorm(x)
    rmsnorm(x.data(), L.post_norm.data(), L.post_norm.dtype, T, m.hidden, m.rms_eps, h.data(), &pool_);
    const MatmulOut gate_up[2] = {{L.gate.data(), L.gate.dtype, m.ffn, nullptr, g.data()},
                                  {L.up.data(), L.up.dtype, m.ffn, nullptr, u.data()}};
    matmul_multi(h.data(), T, m.hidden, gate_up, 2, &pool_);
    swiglu(g.data(), u.data(), T, m.ffn, g.data(), &pool_);
    matmul(g.data(), T, m.ffn, L.down.data(), L.down.dtype, m.hidden, nullptr, o.data(), &pool_);
    for (int64_t i = 0; i < T * H; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
  }
  // Final norm and the LM head only for the rows that need logits.
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  if (R == 0) return;
  std::vector<float> sel(static_cast<size_t>(R * H)), nsel(static_cast<size_t>(R * H));
  for (int32_t r = 0; r < R; ++r)
    std::memcpy(&sel[static_cast<size_t>(r * H)], &x[static_cast<size_t>(b.logit_rows[static_cast<size_t>(r)] * H)], static_cast<size_t>(H) * 4);
  rmsnorm(sel.data(), final_norm_.data(), final_norm_.dtype, R, m.hidden, m.rms_eps, nsel.data(), &pool_);
  const Weight& head = m.tied_embeddings ? embed_ : lm_head_;
  matmul(nsel.data(), R, m.hidden, head.data(), head.dtype, m.vocab, nullptr, logits, &pool_);
}

std::string Engine::validate_pages(const std::vector<int32_t>& ids) const {
  if (!has_pool()) return "transfer: the engine has no page pool (call createPool first)";
  std::unordered_set<int32_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_pages_)
      return "transfer: " + at("pageIds", i) + " = " + std::to_string(ids[i]) + " is not a page of the pool [0, " + std::to_string(num_pages_) + ")";
    if (!seen.insert(ids[i]).second) return "transfer: " + at("pageIds", i) + " = " + std::to_string(ids[i]) + " appears twice";
  }
  return "";
}

// Byte layout of a transfer: for each requested page in order, for each layer
// l ascending: K page [page_size, n_kv, head_dim] f16, then V page
// [page_size, n_kv, v_head_dim] f16 (little-endian binary16).
void Engine::download_pages(const std::vector<int32_t>& ids, uint8_t* out) const {
  const int64_t kb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.head_dim * 2;
  const int64_t vb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.v_head_dim * 2;
  for (int32_t id : ids) {
    for (int32_t l = 0; l < spec_.n_layers; ++l) {
      std::memcpy(out, reinterpret_cast<const uint8_t*>(k_pages_[static_cast<size_t>(l)].ptr.get()) + id * kb, static_cast<size_t>(kb));
      out += kb;
      std::memcpy(out, reinterpret_cast<const uint8_t*>(v_pages_[static_cast<size_t>(l)].ptr.get()) + id * vb, static_cast<size_t>(vb));
      out += vb;
    }
  }
}

void Engine::upload_pages(const std::vector<int32_t>& ids, const uint8_t* in) {
  const int64_t kb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.head_dim * 2;
  const int64_t vb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.v_head_dim * 2;
  for (int32_t id : ids) {
    for (int32_t l = 0; l < spec_.n_layers; ++l) {
      std::memcpy(reinterpret_cast<uint8_t*>(k_pages_[static_cast<size_t>(l)].ptr.get()) + id * kb, in, static_cast<size_t>(kb));
      in += kb;
      std::memcpy(reinterpret_cast<uint8_t*>(v_pages_[static_cast<size_t>(l)].ptr.get()) + id * vb, in, static_cast<size_t>(vb));
      in += vb;
    }
  }
}

void Engine::copy_page(int32_t src, int32_t dst) {
  const int64_t kb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.head_dim * 2;
  const int64_t vb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.v_head_dim * 2;
  for (int32_t l = 0; l < spec_.n_layers; ++l) {
    auto* kp = reinterpret_cast<uint8_t*>(k_pages_[static_cast<size_t>(l)].ptr.get());
    auto* vp = reinterpret_cast<uint8_t*>(v_pages_[static_cast<size_t>(l)].ptr.get());
    std::memcpy(kp + dst * kb, kp + src * kb, static_cast<size_t>(kb));
    std::memcpy(vp + dst * vb, vp + src * vb, static_cast<size_t>(vb));
  }
}

}  // namespace ck
