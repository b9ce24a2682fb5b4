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

Engine::Engine(const ModelSpec& spec, std::vector<float> inv_freq, int32_t threads)
    : spec_(spec), inv_freq_(std::move(inv_freq)), pool_(threads, /*background=*/true), layers_(static_cast<size_t>(spec.n_layers)) {}

std::string Engine::set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) {
  const std::string err = check_weight(spec_, index, dtype, bytes);
  if (!err.empty()) return err;
  const BlockShape block = block_shape(dtype);
  const int64_t elems = static_cast<int64_t>(bytes) / block.bytes * block.elems;
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
        default: break;  // biases are never quantized (check_weight)
      }
    }
  };
  const WeightPlace place = weight_place(spec_, index);
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
    case WeightRole::O: L->o = std::move(w); break;
    case WeightRole::PostNorm: L->post_norm = std::move(w); break;
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
  return validate_paged_batch(b, spec_, num_pages_, page_size_);
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
  std::vector<float>& sel = sized(act_.sel, R * H);
  std::vector<float>& nsel = sized(act_.nsel, R * H);
  for (int32_t r = 0; r < R; ++r)
    std::memcpy(&sel[static_cast<size_t>(r * H)], &x[static_cast<size_t>(b.logit_rows[static_cast<size_t>(r)] * H)], static_cast<size_t>(H) * 4);
  rmsnorm(sel.data(), final_norm_.data(), final_norm_.dtype, R, m.hidden, m.rms_eps, nsel.data(), &pool_);
  const Weight& head = m.tied_embeddings ? embed_ : lm_head_;
  matmul(nsel.data(), R, m.hidden, head.data(), head.dtype, m.vocab, nullptr, logits, &pool_);
}

std::string Engine::validate_pages(const std::vector<int32_t>& ids) const {
  return validate_page_ids(ids, num_pages_);
}

// Byte layout of a transfer: for each requested page in order, for each layer
// l ascending: K page [page_size, n_kv, head_dim] f16, then V page
// [page_size, n_kv, v_head_dim] f16 (little-endian binary16).
void Engine::download_pages(const std::vector<int32_t>& ids, uint8_t* out) {
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
