#include "engine.h"

#include "cpu.h"
#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ck {

F16Buffer F16Buffer::zeroed(int64_t elems) {
  F16Buffer b;
  b.elems = elems;
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, elems));
  b.ptr.reset(static_cast<f16*>(std::calloc(n, sizeof(f16))));
  // Before the first touch, so the first write faults in 2 MiB pages: paged
  // attention jumps to a page anywhere in the pool every page_size keys, and
  // with 4 KiB pages every jump lands on translations no recent access used
  // (a TLB miss and a page walk); 2 MiB pages need 512x fewer translations.
  if (b.ptr) advise_huge_pages(b.ptr.get(), n * sizeof(f16));
  return b;
}

uint8_t* WeightArena::allocate(size_t n) {
  constexpr size_t kHuge = size_t{2} << 20, kChunk = size_t{32} << 20, kAlign = 64;
  const size_t need = std::max<size_t>(kAlign, (n + kAlign - 1) & ~(kAlign - 1));
  if (need > left_) {
    // A new chunk; the old one's untouched tail is never faulted in.
    const size_t bytes = std::max(kChunk, (need + kHuge - 1) & ~(kHuge - 1));
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, bytes));
    if (p == nullptr) return nullptr;
    advise_huge_pages(p, bytes);
    chunks_.emplace_back(p);
    next_ = p;
    left_ = bytes;
  }
  uint8_t* out = next_;
  next_ += need;
  left_ -= need;
  return out;
}

Engine::Engine(const ModelSpec& spec, std::vector<float> inv_freq, int32_t threads)
    : spec_(spec),
      inv_freq_(per_layer_inv_freq(spec, std::move(inv_freq))),
      pool_(threads, /*background=*/true),
      layers_(static_cast<size_t>(spec.n_layers)) {}

std::string Engine::set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) {
  const std::string err = check_weight(spec_, index, dtype, bytes);
  if (!err.empty()) return err;
  const BlockShape block = block_shape(dtype);
  const int64_t elems = static_cast<int64_t>(bytes) / block.bytes * block.elems;
  const WeightPlace place = weight_place(spec_, index);
  Weight w;
  w.dtype = dtype;
  w.elems = elems;
  if (spec_.norm_offset && is_norm(place.role)) {
    // Gemma's RMSNorm scales by (1 + w), computed in f32 as Hugging Face
    // does (1.0 + weight.float()): the sum is kept as an f32 weight.
    w.dtype = DType::F32;
    std::vector<float> f(static_cast<size_t>(elems));
    for (int64_t i = 0; i < elems; ++i) {
      float v = 0.0f;
      switch (dtype) {
        case DType::F32: std::memcpy(&v, data + 4 * i, 4); break;
        case DType::F16: v = f16_to_f32(reinterpret_cast<const f16*>(data)[i]); break;
        case DType::BF16: v = bf16_to_f32(reinterpret_cast<const bf16*>(data)[i]); break;
      }
      f[static_cast<size_t>(i)] = 1.0f + v;
    }
    uint8_t* p = arena_.allocate(f.size() * sizeof(float));
    if (p == nullptr) return "setWeight: out of memory for weight " + std::to_string(index);
    std::memcpy(p, f.data(), f.size() * sizeof(float));
    w.bytes = p;
  } else {
    uint8_t* p = arena_.allocate(bytes);
    if (p == nullptr) return "setWeight: out of memory for weight " + std::to_string(index);
    std::memcpy(p, data, bytes);
    w.bytes = p;
  }

  auto to_f32 = [&](std::vector<float>& out) {
    out.resize(static_cast<size_t>(elems));
    for (int64_t i = 0; i < elems; ++i) {
      switch (dtype) {
        case DType::F32: std::memcpy(&out[static_cast<size_t>(i)], data + 4 * i, 4); break;
        case DType::F16: out[static_cast<size_t>(i)] = f16_to_f32(reinterpret_cast<const f16*>(data)[i]); break;
        case DType::BF16: out[static_cast<size_t>(i)] = bf16_to_f32(reinterpret_cast<const bf16*>(data)[i]); break;
        default: break;  // biases are never quantized (check_weight)
      }
    }
  };
  LayerWeights* L = place.layer >= 0 ? &layers_[static_cast<size_t>(place.layer)] : nullptr;
  switch (place.role) {
    case WeightRole::Embed: embed_ = std::move(w); break;
    case WeightRole::InputNorm: L->input_norm = std::move(w); break;
    case WeightRole::Q: L->q = std::move(w); break;
    case WeightRole::K: L->k = std::move(w); break;
    case WeightRole::V: L->v = std::move(w); break;
    case WeightRole::QBias: to_f32(L->q_bias); break;
    case WeightRole::KBias: to_f32(L->k_bias); break;
    case WeightRole::VBias: to_f32(L->v_bias); break;
    case WeightRole::QNorm: L->q_norm = std::move(w); break;
    case WeightRole::KNorm: L->k_norm = std::move(w); break;
    case WeightRole::O: L->o = std::move(w); break;
    case WeightRole::AttnOutNorm: L->attn_out_norm = std::move(w); break;
    case WeightRole::MlpNorm: L->mlp_norm = std::move(w); break;
    case WeightRole::MlpOutNorm: L->mlp_out_norm = std::move(w); break;
    case WeightRole::Gate: L->gate = std::move(w); break;
    case WeightRole::Up: L->up = std::move(w); break;
    case WeightRole::Down: L->down = std::move(w); break;
    case WeightRole::FinalNorm: final_norm_ = std::move(w); break;
    case WeightRole::LmHead: lm_head_ = std::move(w); break;
  }
  return "";
}

std::string Engine::allocate_pool(int64_t num_pages, int32_t page_size) {
  const int64_t slots = num_pages * page_size;
  for (int32_t l = 0; l < groups_.n_slots; ++l) {
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

void Engine::commit_pool() {
  for (auto* pools : {&k_pages_, &v_pages_})
    for (F16Buffer& b : *pools) commit_pages(b.ptr.get(), static_cast<size_t>(b.elems) * sizeof(f16));
}

std::string Engine::allocate_contiguous(int32_t num_seqs, int32_t ctx_cap) {
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

std::string Engine::validate_paged(const StepBatch& b) const {
  return validate_paged_batch(b, spec_, groups_, num_pages_, page_size_);
}

std::string Engine::validate_contiguous(const StepBatch& b) const {
  return validate_contiguous_batch(b, spec_, ctx_seqs_, ctx_cap_);
}

void Engine::step(const StepBatch& b, float* logits) { forward(b, Mode::Paged, logits); }
void Engine::step_contiguous(const StepBatch& b, float* logits) { forward(b, Mode::Contiguous, logits); }

void Engine::forward(const StepBatch& b, Mode mode, float* logits) {
  const ModelSpec& m = spec_;
  const int32_t T = b.T();
  const int64_t H = m.hidden, F = m.ffn;
  const int32_t qn = m.n_heads * m.head_dim, kn = m.n_kv * m.head_dim, vn = m.n_kv * m.v_head_dim;
  const int32_t on = m.n_heads * m.v_head_dim;
  const int32_t half = m.head_dim / 2;
  auto sized = [](std::vector<float>& buf, int64_t n) -> std::vector<float>& {
    if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
    return buf;
  };
  std::vector<float>& x = sized(act_.x, T * H);
  std::vector<float>& h = sized(act_.h, T * H);
  std::vector<float>& o = sized(act_.o, T * H);
  std::vector<float>& q = sized(act_.q, static_cast<int64_t>(T) * qn);
  std::vector<float>& k = sized(act_.k, static_cast<int64_t>(T) * kn);
  std::vector<float>& v = sized(act_.v, static_cast<int64_t>(T) * vn);
  std::vector<float>& attn = sized(act_.attn, static_cast<int64_t>(T) * on);
  std::vector<float>& g = sized(act_.g, T * F);
  std::vector<float>& u = sized(act_.u, T * F);
  const float scale = m.softmax_scale();
  // An RMSNorm of rows [rows, D] in place of `y` (Gemma's (1 + w) is in the weight already).
  auto norm = [&](const float* in, const Weight& w, int32_t rows, int32_t D, float* y) {
    rmsnorm(in, w.data(), w.dtype, rows, D, m.rms_eps, y, &pool_);
  };

  // Contiguous rows land at slot seq * ctx_cap + pos of the per-layer cache.
  std::vector<int32_t> ctx_slots;
  if (mode == Mode::Contiguous) {
    ctx_slots.resize(static_cast<size_t>(T));
    for (int32_t t = 0; t < T; ++t) ctx_slots[static_cast<size_t>(t)] = b.row_seq[static_cast<size_t>(t)] * ctx_cap_ + b.positions[static_cast<size_t>(t)];
  }
  // Paged: layer l goes through its group's slot mapping and page table ([groups, T], [groups, S, ptStride]).
  const int64_t S = mode == Mode::Paged ? static_cast<int64_t>(b.page_table.size()) / (static_cast<int64_t>(groups_.n_groups) * b.pt_stride) : 0;

  // x = embed_tokens[id] * embed_scale (Gemma; 1 otherwise, and then skipped)
  embed(b.tokens.data(), T, embed_.data(), embed_.dtype, m.hidden, x.data(), &pool_);
  if (m.embed_scale != 1.0f)
    for (int64_t i = 0; i < T * H; ++i) x[static_cast<size_t>(i)] *= m.embed_scale;
  for (int32_t l = 0; l < m.n_layers; ++l) {
    const LayerWeights& L = layers_[static_cast<size_t>(l)];
    const float* inv_freq = inv_freq_.data() + static_cast<size_t>(l) * half;
    const size_t store = mode == Mode::Paged ? static_cast<size_t>(groups_.slot[static_cast<size_t>(l)]) : static_cast<size_t>(l);
    const int64_t grp = mode == Mode::Paged ? groups_.group[static_cast<size_t>(l)] : 0;
    f16* kc = mode == Mode::Paged ? k_pages_[store].ptr.get() : k_ctx_[store].ptr.get();
    f16* vc = mode == Mode::Paged ? v_pages_[store].ptr.get() : v_ctx_[store].ptr.get();
    const int32_t* slots = mode == Mode::Paged ? b.slots.data() + grp * T : ctx_slots.data();
    const int32_t* table = mode == Mode::Paged ? b.page_table.data() + grp * S * b.pt_stride : nullptr;
    // attention block: x += [norm](o_proj(attn(rope(q), rope(k), v))) of norm(x)
    norm(x.data(), L.input_norm, T, m.hidden, h.data());
    const MatmulOut qkv[3] = {
        {L.q.data(), L.q.dtype, qn, L.q_bias.empty() ? nullptr : L.q_bias.data(), q.data()},
        {L.k.data(), L.k.dtype, kn, L.k_bias.empty() ? nullptr : L.k_bias.data(), k.data()},
        {L.v.data(), L.v.dtype, vn, L.v_bias.empty() ? nullptr : L.v_bias.data(), v.data()}};
    matmul_multi(h.data(), T, m.hidden, qkv, 3, &pool_);
    if (m.qk_norm) {
      // q [T * n_heads, head_dim] and k [T * n_kv, head_dim]: one RMSNorm per head, in place.
      norm(q.data(), L.q_norm, T * m.n_heads, m.head_dim, q.data());
      norm(k.data(), L.k_norm, T * m.n_kv, m.head_dim, k.data());
    }
    rope(q.data(), T, m.n_heads, m.head_dim, b.positions.data(), inv_freq, &pool_);
    rope(k.data(), T, m.n_kv, m.head_dim, b.positions.data(), inv_freq, &pool_);
    if (m.rope_scale != 1.0f) {
      // LongRoPE: Hugging Face scales cos and sin, so both rotated q and k (and the K pages hold k scaled).
      for (int64_t i = 0; i < static_cast<int64_t>(T) * qn; ++i) q[static_cast<size_t>(i)] *= m.rope_scale;
      for (int64_t i = 0; i < static_cast<int64_t>(T) * kn; ++i) k[static_cast<size_t>(i)] *= m.rope_scale;
    }
    routed_append(k.data(), slots, T, kn, kc, &pool_);
    routed_append(v.data(), slots, T, vn, vc, &pool_);
    if (mode == Mode::Paged) {
      PagedAttention a{q.data(), kc, vc, table, b.row_seq.data(), b.positions.data(), attn.data(),
                       T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, page_size_, b.pt_stride, num_pages_, scale,
                       m.window_of(l), m.attn_softcap};
      paged_attention(a, &pool_);
    } else {
      ContiguousAttention a{q.data(), kc, vc, b.row_seq.data(), b.positions.data(), attn.data(),
                            T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, ctx_cap_, scale,
                            m.window_of(l), m.attn_softcap};
      contiguous_attention(a, &pool_);
    }
    matmul(attn.data(), T, on, L.o.data(), L.o.dtype, m.hidden, nullptr, o.data(), &pool_);
    if (m.sandwich_norms) norm(o.data(), L.attn_out_norm, T, m.hidden, o.data());
    for (int64_t i = 0; i < T * H; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
    // MLP block: x += [norm](down(act(gate(h)) * up(h))) of h = norm(x)
    norm(x.data(), L.mlp_norm, T, m.hidden, h.data());
    const MatmulOut gate_up[2] = {{L.gate.data(), L.gate.dtype, m.ffn, nullptr, g.data()},
                                  {L.up.data(), L.up.dtype, m.ffn, nullptr, u.data()}};
    matmul_multi(h.data(), T, m.hidden, gate_up, 2, &pool_);
    if (m.activation == Activation::GeluTanh) geglu(g.data(), u.data(), T, m.ffn, g.data(), &pool_);
    else swiglu(g.data(), u.data(), T, m.ffn, g.data(), &pool_);
    matmul(g.data(), T, m.ffn, L.down.data(), L.down.dtype, m.hidden, nullptr, o.data(), &pool_);
    if (m.sandwich_norms) norm(o.data(), L.mlp_out_norm, T, m.hidden, o.data());
    for (int64_t i = 0; i < T * H; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
  }
  // Final norm and the LM head only for the rows that need logits.
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  if (R == 0) return;
  std::vector<float>& sel = sized(act_.sel, R * H);
  std::vector<float>& nsel = sized(act_.nsel, R * H);
  for (int32_t r = 0; r < R; ++r)
    std::memcpy(&sel[static_cast<size_t>(r * H)], &x[static_cast<size_t>(b.logit_rows[static_cast<size_t>(r)] * H)], static_cast<size_t>(H) * 4);
  norm(sel.data(), final_norm_, R, m.hidden, nsel.data());
  const Weight& head = m.tied_embeddings ? embed_ : lm_head_;
  matmul(nsel.data(), R, m.hidden, head.data(), head.dtype, m.vocab, nullptr, logits, &pool_);
  if (m.final_softcap > 0.0f) softcap(logits, static_cast<int64_t>(R) * m.vocab, m.final_softcap, &pool_);
}

std::string Engine::validate_pages(const std::vector<int32_t>& ids) const {
  return validate_page_ids(ids, num_pages_);
}

// Byte layout of a transfer: for each requested page in order, for each
// storage slot ascending (a layer of the page's group; every layer with one group): K page [page_size, n_kv, head_dim] f16, then V page
// [page_size, n_kv, v_head_dim] f16 (little-endian binary16).
void Engine::download_pages(const std::vector<int32_t>& ids, uint8_t* out) {
  const int64_t kb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.head_dim * 2;
  const int64_t vb = static_cast<int64_t>(page_size_) * spec_.n_kv * spec_.v_head_dim * 2;
  for (int32_t id : ids) {
    for (int32_t l = 0; l < groups_.n_slots; ++l) {
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
    for (int32_t l = 0; l < groups_.n_slots; ++l) {
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
  for (int32_t l = 0; l < groups_.n_slots; ++l) {
    auto* kp = reinterpret_cast<uint8_t*>(k_pages_[static_cast<size_t>(l)].ptr.get());
    auto* vp = reinterpret_cast<uint8_t*>(v_pages_[static_cast<size_t>(l)].ptr.get());
    std::memcpy(kp + dst * kb, kp + src * kb, static_cast<size_t>(kb));
    std::memcpy(vp + dst * vb, vp + src * vb, static_cast<size_t>(vb));
  }
}

}  // namespace ck
