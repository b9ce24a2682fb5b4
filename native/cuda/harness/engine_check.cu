// The CUDA engine in the harness: its step() against the CPU engine's, and
// the determinism contract through the full step (a row's logits alone, in a
// batch of 16 with random neighbours, and across prefill chunkings).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../../src/engine.h"
#include "../engine_cuda.cuh"
#include "harness.cuh"

namespace ck::harness {
namespace {

// A 2-layer random test model: GQA with head_dim 64, RoPE theta 10000.
struct TestModel {
  ck::ModelSpec spec;
  std::vector<float> inv_freq;
};

TestModel test_model(int32_t hidden, int32_t n_heads, int32_t ffn, int32_t vocab, bool bias, int32_t max_position) {
  TestModel t;
  ck::ModelSpec& m = t.spec;
  m.n_layers = 2;
  m.hidden = hidden;
  m.n_heads = n_heads;
  m.n_kv = 2;
  m.head_dim = 64;
  m.v_head_dim = 64;
  m.ffn = ffn;
  m.vocab = vocab;
  m.rms_eps = 1e-5f;
  m.attention_bias = bias;
  m.tied_embeddings = false;
  m.max_position = max_position;
  t.inv_freq.resize(static_cast<size_t>(m.head_dim / 2));
  for (size_t i = 0; i < t.inv_freq.size(); ++i)
    t.inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / m.head_dim));
  return t;
}

}  // namespace

// ---- the CUDA engine's step() against the CPU engine -----------------------------
// One small random model (GQA, q/k/v bias, weights in all three dtypes), the
// same weights loaded into both engines; a ragged prefill over shuffled,
// fragmented pages, then a decode step. The logits agree to the CUDA GEMM's
// rounding of x to the 16-bit weight types (~1e-3 relative per bf16 GEMM,
// kernels_cuda.cuh), not to fp32 rounding; on the GPU the paged path must
// give the same bits as its contiguous oracle; page transfers round-trip.
void check_engine(Tally& tally, std::mt19937_64& rng) {
  const TestModel tm = test_model(256, 4, 512, 1000, true, 1024);
  const ck::ModelSpec& m = tm.spec;
  const std::vector<float>& inv = tm.inv_freq;

  ck::Engine cpu(m, inv, static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
  ck::cuda::CudaEngine gpu(m, inv);
  const std::vector<ck::TensorSlot> slots = ck::tensor_slots(m);
  const ck::DType dtypes[] = {ck::DType::BF16, ck::DType::F16, ck::DType::F32};
  std::string load_err;
  for (size_t i = 0; i < slots.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : slots[i].shape) n *= d;
    const bool norm = slots[i].name.find("norm.weight") != std::string::npos;
    const float scale = slots[i].shape.size() == 1 ? 0.1f : 1.7f / std::sqrt(static_cast<float>(slots[i].shape.back()));
    std::vector<float> w = randn(rng, static_cast<size_t>(n), norm ? 0.2f : scale);
    if (norm)
      for (auto& x : w) x += 1.0f;
    const ck::DType dt = dtypes[i % 3];
    std::vector<uint8_t> bytes;
    if (dt == ck::DType::F32) {
      bytes.resize(w.size() * 4);
      std::memcpy(bytes.data(), w.data(), bytes.size());
    } else {
      const std::vector<uint16_t> h = to_weight(w, dt);
      bytes.resize(h.size() * 2);
      std::memcpy(bytes.data(), h.data(), bytes.size());
    }
    load_err += cpu.set_weight(i, dt, bytes.data(), bytes.size());
    load_err += gpu.set_weight(i, dt, bytes.data(), bytes.size());
  }
  tally.check(load_err.empty(), "engine: weights load on both backends", load_err.empty() ? "ok" : load_err);

  const int32_t page = 16, num_pages = 64, stride = 8;
  std::string pool_err = cpu.create_pool(num_pages, page) + gpu.create_pool(num_pages, page);
  pool_err += cpu.create_contiguous(3, stride * page) + gpu.create_contiguous(3, stride * page);
  tally.check(pool_err.empty(), "engine: pools and contiguous caches", pool_err.empty() ? "ok" : pool_err);

  // Three sequences on shuffled pages: prompts of 37, 5 and 70 tokens.
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  const std::vector<int32_t> lens = {37, 5, 70};
  std::vector<int32_t> table(lens.size() * stride, -1);
  for (size_t s = 0, next = 0; s < lens.size(); ++s)
    for (int32_t i = 0; i < stride; ++i) table[s * stride + static_cast<size_t>(i)] = pages[next++];
  std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
  auto make_batch = [&](int32_t from_pos, const std::vector<int32_t>& upto) {
    ck::StepBatch b;
    b.pt_stride = stride;
    b.page_table = table;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int32_t p = from_pos < 0 ? 0 : upto[s] - 1; p < upto[s]; ++p) {
        b.tokens.push_back(tok(rng));
        b.positions.push_back(p);
        b.row_seq.push_back(static_cast<int32_t>(s));
        b.slots.push_back(table[s * stride + static_cast<size_t>(p / page)] * page + p % page);
      }
      b.logit_rows.push_back(b.T() - 1);
    }
    return b;
  };
  auto compare_step = [&](const ck::StepBatch& b, const char* what) {
    const std::string verr = cpu.validate_paged(b) + gpu.validate_paged(b);
    tally.check(verr.empty(), std::string("engine: ") + what + " batch valid on both", verr.empty() ? "ok" : verr);
    if (!verr.empty()) return;
    const size_t n = b.logit_rows.size() * static_cast<size_t>(m.vocab);
    std::vector<float> lc(n), lg(n, std::nanf("")), lo(n, std::nanf(""));
    cpu.step(b, lc.data());
    gpu.step(b, lg.data());
    gpu.step_contiguous(b, lo.data());
    const Diff d = compare(lg, lc);
    tally.check(d.non_finite == 0 && d.rel_l2 < 1e-2, std::string("engine: CUDA step() vs CPU, ") + what, d.str());
    tally.check(same_bits(lg.data(), lo.data(), n), std::string("engine: CUDA paged == contiguous bits, ") + what,
                same_bits(lg.data(), lo.data(), n) ? "identical" : "differ");
  };
  compare_step(make_batch(-1, lens), "prefill 37+5+70 rows");
  std::vector<int32_t> next = lens;
  for (auto& l : next) ++l;
  compare_step(make_batch(0, next), "decode 3 rows");

  // Transfers: download pages of sequence 2, upload them elsewhere, copy one back.
  const std::vector<int32_t> src = {table[2 * stride], table[2 * stride + 1], table[2 * stride + 4]};
  const std::vector<int32_t> dst = {pages[40], pages[41], pages[42]};
  const size_t bpp = static_cast<size_t>(gpu.page_bytes());
  std::vector<uint8_t> a(src.size() * bpp), b(src.size() * bpp, 0xab), c(bpp);
  gpu.download_pages(src, a.data());
  gpu.upload_pages(dst, a.data());
  gpu.download_pages(dst, b.data());
  gpu.copy_page(dst[2], pages[43]);
  gpu.download_pages({pages[43]}, c.data());
  const bool round_trip = a == b && std::memcmp(c.data(), a.data() + 2 * bpp, bpp) == 0;
  tally.check(round_trip, "engine: CUDA download/upload/copy round trip", round_trip ? "bytes identical" : "differ");
  // The CPU engine holds the same keys and values to the GEMM's rounding of x.
  std::vector<uint8_t> cpu_a(a.size());
  cpu.download_pages(src, cpu_a.data());
  std::vector<float> kv_gpu(a.size() / 2), kv_cpu(a.size() / 2);
  for (size_t i = 0; i < kv_gpu.size(); ++i) {
    uint16_t hg, hc;
    std::memcpy(&hg, &a[2 * i], 2);
    std::memcpy(&hc, &cpu_a[2 * i], 2);
    kv_gpu[i] = ck::f16_to_f32(hg);
    kv_cpu[i] = ck::f16_to_f32(hc);
  }
  const Diff kv = compare(kv_gpu, kv_cpu);
  tally.check(kv.non_finite == 0 && kv.rel_l2 < 1e-2, "engine: CUDA pages vs CPU pages (K/V values)", kv.str());
}

// ---- the determinism contract through the full step ----------------------------------
namespace {

// One sequence's rows in a step: tokens [from, to) of `prompt` on `pages`.
struct SeqRows {
  const std::vector<int32_t>* prompt;
  const std::vector<int32_t>* pages;
  int32_t from, to;
};

// The ragged batch of `rows` (sequence s = index in rows), logits for each sequence's last row.
ck::StepBatch batch_of(const std::vector<SeqRows>& rows, int32_t page, int32_t stride) {
  ck::StepBatch b;
  b.pt_stride = stride;
  b.page_table.assign(rows.size() * static_cast<size_t>(stride), -1);
  for (size_t s = 0; s < rows.size(); ++s) {
    const SeqRows& r = rows[s];
    for (size_t i = 0; i < r.pages->size(); ++i) b.page_table[s * stride + i] = (*r.pages)[i];
    for (int32_t p = r.from; p < r.to; ++p) {
      b.tokens.push_back((*r.prompt)[static_cast<size_t>(p)]);
      b.positions.push_back(p);
      b.row_seq.push_back(static_cast<int32_t>(s));
      b.slots.push_back((*r.pages)[static_cast<size_t>(p / page)] * page + p % page);
    }
    b.logit_rows.push_back(b.T() - 1);
  }
  return b;
}

std::vector<float> step(ck::cuda::CudaEngine& e, const ck::StepBatch& b) {
  const std::string err = e.validate_paged(b);
  if (!err.empty()) throw std::runtime_error("invariance batch: " + err);
  std::vector<float> logits(b.logit_rows.size() * static_cast<size_t>(e.spec().vocab), NAN);
  e.step(b, logits.data());
  return logits;
}

}  // namespace

// A 300-token prompt A (then one decode token) three ways on fresh pages:
// alone; in one step with 15 random neighbours of 1..300 tokens (then a
// decode step of all 16); in random prefill chunks of 1..100 tokens. Its
// last-row logits and decode logits must be the same bits each way. The
// steps take both GEMM tilings (decode T <= 64 and prefill) and every
// attention split count; weights bf16 (as the generated bench model).
void check_engine_invariance(Tally& tally, std::mt19937_64& rng) {
  const TestModel tm = test_model(512, 8, 1024, 2000, false, 2048);
  const ck::ModelSpec& m = tm.spec;
  ck::cuda::CudaEngine gpu(m, tm.inv_freq);
  const std::vector<ck::TensorSlot> slots = ck::tensor_slots(m);
  std::string err;
  for (size_t i = 0; i < slots.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : slots[i].shape) n *= d;
    const bool norm = slots[i].name.find("norm.weight") != std::string::npos;
    const float scale = 1.7f / std::sqrt(static_cast<float>(slots[i].shape.back()));
    std::vector<float> w = randn(rng, static_cast<size_t>(n), norm ? 0.2f : scale);
    if (norm)
      for (auto& x : w) x += 1.0f;
    const std::vector<uint16_t> h = to_weight(w, ck::DType::BF16);
    err += gpu.set_weight(i, ck::DType::BF16, reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2);
  }
  const int32_t page = 16, stride = 20, num_pages = 1024;
  err += gpu.create_pool(num_pages, page);
  tally.check(err.empty(), "engine invariance: model and pool", err.empty() ? "ok" : err);
  if (!err.empty()) return;

  std::vector<int32_t> free_pages(num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  auto take_pages = [&](int32_t tokens) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < (tokens + page - 1) / page; ++i) p.push_back(free_pages.at(free_pages.size() - 1)), free_pages.pop_back();
    return p;
  };
  std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
  auto random_prompt = [&](int32_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = tok(rng);
    return p;
  };
  const int32_t len = 300;
  std::vector<int32_t> a = random_prompt(len + 1);  // the prompt, then the token decoded after it
  const size_t V = static_cast<size_t>(m.vocab);

  // Alone.
  const std::vector<int32_t> pa0 = take_pages(len + 1);
  const std::vector<float> ref_prefill = step(gpu, batch_of({{&a, &pa0, 0, len}}, page, stride));
  const std::vector<float> ref_decode = step(gpu, batch_of({{&a, &pa0, len, len + 1}}, page, stride));

  // With 15 neighbours, A at a random index.
  std::uniform_int_distribution<int32_t> other_len(1, 300);
  std::vector<std::vector<int32_t>> others, other_pages;
  for (int i = 0; i < 15; ++i) {
    const int32_t n = other_len(rng);
    others.push_back(random_prompt(n + 1));
    other_pages.push_back(take_pages(n + 1));
  }
  const std::vector<int32_t> pa1 = take_pages(len + 1);
  const size_t at = rng() % 16;
  std::vector<SeqRows> prefill, decode;
  for (size_t s = 0, o = 0; s < 16; ++s) {
    if (s == at) {
      prefill.push_back({&a, &pa1, 0, len});
      decode.push_back({&a, &pa1, len, len + 1});
    } else {
      const int32_t n = static_cast<int32_t>(others[o].size()) - 1;
      prefill.push_back({&others[o], &other_pages[o], 0, n});
      decode.push_back({&others[o], &other_pages[o], n, n + 1});
      ++o;
    }
  }
  const std::vector<float> batched_prefill = step(gpu, batch_of(prefill, page, stride));
  const std::vector<float> batched_decode = step(gpu, batch_of(decode, page, stride));
  const bool same_prefill = same_bits(ref_prefill.data(), &batched_prefill[at * V], V);
  const bool same_decode = same_bits(ref_decode.data(), &batched_decode[at * V], V);
  tally.check(same_prefill && same_decode, "engine: a row alone == in a batch of 16 (step logits)",
              std::string("prefill ") + (same_prefill ? "identical" : "differ") + ", decode " +
                  (same_decode ? "identical" : "differ") + " (A at index " + std::to_string(at) + ")");

  // Random prefill chunks.
  const std::vector<int32_t> pa2 = take_pages(len + 1);
  std::uniform_int_distribution<int32_t> chunk(1, 100);
  std::vector<float> last;
  std::string sizes;
  for (int32_t p0 = 0; p0 < len;) {
    const int32_t n = std::min(len - p0, chunk(rng));
    last = step(gpu, batch_of({{&a, &pa2, p0, p0 + n}}, page, stride));
    sizes += (sizes.empty() ? "" : "+") + std::to_string(n);
    p0 += n;
  }
  const std::vector<float> chunked_decode = step(gpu, batch_of({{&a, &pa2, len, len + 1}}, page, stride));
  const bool same_chunked = same_bits(ref_prefill.data(), last.data(), V) &&
                            same_bits(ref_decode.data(), chunked_decode.data(), V);
  tally.check(same_chunked, "engine: prefill chunking invariance (step logits)",
              "300 tokens as " + sizes + (same_chunked ? ": identical" : ": differ"));
}

}  // namespace ck::harness
