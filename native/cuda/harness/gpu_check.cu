// GPU check harness: every CUDA kernel against the CPU backend (the same
// kernels.h functions, linked from native/src) on fresh random data, the
// determinism checks on the GPU, the page transfers, the CUDA engine (against
// the CPU engine, and its own batch and chunking invariance), then timings
// against the device copy bandwidth and cuBLAS measured in the same run.
// The GEMM's checks and timings are in gemm_check.cu, the engine's in
// engine_check.cu, the page transfers' in transfer_check.cu.
//
//   gpu_check [seed] [--quick]
//
// Prints one line per check (PASS/FAIL name: figures), a timing table, and a
// closing "N passed, M failed" line; exits 1 on any failure or CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../src/engine.h"
#include "../../src/kernels.h"
#include "../../src/thread_pool.h"
#include "../engine_cuda.cuh"
#include "../f16.cuh"
#include "../kernels_cuda.cuh"
#include "harness.cuh"

namespace {

using namespace ck::harness;

// ---- conversions ----------------------------------------------------------------

void check_conversions(Tally& tally, std::mt19937_64& rng, bool quick) {
  // Edge cases then random bit patterns (every exponent, NaN payloads included).
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                0x7f800001u, 0x7fbfffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
                                0xc77ff000u, 0x38800000u, 0x387fffffu, 0x387fe000u, 0x33800000u, 0x33000000u,
                                0x33000001u, 0x32ffffffu, 0x00000001u, 0x3f801000u, 0x3f803000u, 0x3f800fffu,
                                0x3f801001u, 0x33c00000u, 0x34200000u, 0x7f7fffffu};
  const size_t n_rand = quick ? (size_t{1} << 22) : (size_t{1} << 26);
  for (size_t i = 0; i < n_rand; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  // Every f16 value's neighbourhood: the exact value and the midpoints around it.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    uint32_t u;
    const float f = ck::f16_to_f32(static_cast<f16>(h));
    std::memcpy(&u, &f, 4);
    bits.push_back(u);
    bits.push_back(u + 0x1000u);  // for normals: the midpoint to the next f16
    bits.push_back((u + 0x1000u) | 0x80000000u);
  }
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * 4);
  DevBuf<float> dx(x);
  DevBuf<f16> dh(x.size());
  dh.poison();
  ck::cuda::f32_to_f16(dx.get(), static_cast<int64_t>(x.size()), dh.get(), nullptr);
  const std::vector<f16> gpu = dh.download();
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    const f16 cpu = ck::f32_to_f16(x[i]);
    const f16 host = ck::cuda::f32_to_f16_rne(x[i]);  // the shared host/device formula, on the host
    if (gpu[i] != cpu || host != cpu) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatches;
    }
  }
  char b[200];
  std::snprintf(b, sizeof b, "%zu values, %lld differ from CPU f32_to_f16 (first differing input: 0x%08x)",
                x.size(), static_cast<long long>(mismatches),
                first >= 0 ? bits[static_cast<size_t>(first)] : 0u);
  tally.check(mismatches == 0, "f32_to_f16 bit-exact vs CPU", b);

  // f16 -> f32 and bf16 -> f32 over all 65536 patterns.
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), 0);
  DevBuf<uint16_t> dall(all);
  DevBuf<float> df(65536);
  int64_t bad16 = 0, badbf = 0;
  for (int pass = 0; pass < 2; ++pass) {
    df.poison();
    if (pass == 0)
      ck::cuda::f16_to_f32(dall.get(), 65536, df.get(), nullptr);
    else
      ck::cuda::bf16_to_f32(dall.get(), 65536, df.get(), nullptr);
    const std::vector<float> g = df.download();
    for (uint32_t h = 0; h < 65536; ++h) {
      const float c = pass == 0 ? ck::f16_to_f32(static_cast<f16>(h)) : ck::bf16_to_f32(static_cast<uint16_t>(h));
      if (std::memcmp(&c, &g[h], 4) != 0) (pass == 0 ? bad16 : badbf)++;
    }
  }
  tally.check(bad16 == 0, "f16_to_f32 bit-exact, all 65536", std::to_string(bad16) + " differ");
  tally.check(badbf == 0, "bf16_to_f32 bit-exact, all 65536", std::to_string(badbf) + " differ");
}

// ---- routed append --------------------------------------------------------------

void check_append(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool) {
  const int32_t n_kv = 8, head_dim = 128, row_elems = n_kv * head_dim, page_size = 16, num_pages = 512;
  const int64_t num_slots = int64_t{num_pages} * page_size;
  for (int32_t B : {1, 7, 64, 1000}) {
    std::vector<int32_t> perm(static_cast<size_t>(num_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> slots(perm.begin(), perm.begin() + B);
    std::vector<float> rows = randn(rng, static_cast<size_t>(B) * row_elems, 3.0f);
    // Include values that exercise rounding: ties, overflow, subnormals.
    rows[0] = 65520.0f;
    rows[1] = 1.0f + 1.0f / 2048.0f;
    rows[2] = 3e-8f;
    std::vector<f16> cpu_pages(static_cast<size_t>(num_slots) * row_elems, 0xffffu);
    ck::routed_append(rows.data(), slots.data(), B, row_elems, cpu_pages.data(), pool);
    DevBuf<float> drows(rows);
    DevBuf<int32_t> dslots(slots);
    DevBuf<f16> dpages(cpu_pages.size());
    dpages.poison();  // 0xffff everywhere, like the CPU pool before the append
    ck::cuda::routed_append(drows.get(), dslots.get(), B, row_elems, num_slots, dpages.get(), nullptr);
    const std::vector<f16> gpu_pages = dpages.download();
    const bool same = gpu_pages == cpu_pages;  // written slots equal, untouched slots still poison
    tally.check(same, "routed_append bit-exact, B=" + std::to_string(B),
                same ? "pages identical (written and untouched)" : "pages differ");
  }
}

// ---- attention ------------------------------------------------------------------

// A random paged cache: S sequences of given lengths over a shuffled pool, and
// the same keys laid out contiguously.
struct Cache {
  int32_t S, n_kv, head_dim, page_size, pt_stride, ctx_cap, num_pages;
  std::vector<int32_t> lens, page_table;
  std::vector<f16> k_pages, v_pages, k_cont, v_cont;
};

Cache make_cache(std::mt19937_64& rng, const std::vector<int32_t>& lens, int32_t n_kv, int32_t head_dim,
                 int32_t page_size) {
  Cache c;
  c.S = static_cast<int32_t>(lens.size());
  c.n_kv = n_kv;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.lens = lens;
  c.ctx_cap = *std::max_element(lens.begin(), lens.end());
  c.pt_stride = (c.ctx_cap + page_size - 1) / page_size;
  int32_t needed = 0;
  for (int32_t l : lens) needed += (l + page_size - 1) / page_size;
  c.num_pages = needed + needed / 4 + 3;  // spare pages stay unreferenced (fragmented pool)
  std::vector<int32_t> perm(static_cast<size_t>(c.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.page_table.assign(static_cast<size_t>(c.S) * c.pt_stride, -1);
  size_t next = 0;
  for (int32_t s = 0; s < c.S; ++s)
    for (int32_t p = 0; p < (lens[static_cast<size_t>(s)] + page_size - 1) / page_size; ++p)
      c.page_table[static_cast<size_t>(s) * c.pt_stride + p] = perm[next++];
  const size_t row = static_cast<size_t>(n_kv) * head_dim;
  c.k_pages = rand_f16(rng, static_cast<size_t>(c.num_pages) * page_size * row);
  c.v_pages = rand_f16(rng, static_cast<size_t>(c.num_pages) * page_size * row);
  c.k_cont.assign(static_cast<size_t>(c.S) * c.ctx_cap * row, 0);
  c.v_cont.assign(c.k_cont.size(), 0);
  for (int32_t s = 0; s < c.S; ++s)
    for (int32_t j = 0; j < lens[static_cast<size_t>(s)]; ++j) {
      const size_t slot = static_cast<size_t>(c.page_table[static_cast<size_t>(s) * c.pt_stride + j / page_size]) *
                              page_size + j % page_size;
      const size_t dst = (static_cast<size_t>(s) * c.ctx_cap + j) * row;
      std::memcpy(&c.k_cont[dst], &c.k_pages[slot * row], row * 2);
      std::memcpy(&c.v_cont[dst], &c.v_pages[slot * row], row * 2);
    }
  return c;
}

struct DevCache {
  DevBuf<f16> k_pages, v_pages, k_cont, v_cont;
  DevBuf<int32_t> page_table;
  explicit DevCache(const Cache& c)
      : k_pages(c.k_pages), v_pages(c.v_pages), k_cont(c.k_cont), v_cont(c.v_cont), page_table(c.page_table) {}
};

struct Rows {
  std::vector<int32_t> seq, pos;
  int32_t max_keys() const { return *std::max_element(pos.begin(), pos.end()) + 1; }
};

// Float64 reference for one (row, head).
// window > 0: only keys pos - window + 1 .. pos; softcap > 0: s = softcap tanh(s / softcap).
void attention_f64(const Cache& c, const float* q, int32_t seq, int32_t pos, int32_t kvh, float scale,
                   std::vector<double>& out, int32_t window = 0, float softcap = 0.0f) {
  const int32_t D = c.head_dim;
  const size_t row = static_cast<size_t>(c.n_kv) * D;
  const int32_t lo = window > 0 ? std::max(0, pos - window + 1) : 0;
  std::vector<double> s(static_cast<size_t>(pos) + 1);
  double m = -INFINITY;
  for (int32_t j = lo; j <= pos; ++j) {
    const f16* k = &c.k_cont[(static_cast<size_t>(seq) * c.ctx_cap + j) * row + static_cast<size_t>(kvh) * D];
    double d = 0;
    for (int32_t i = 0; i < D; ++i) d += static_cast<double>(q[i]) * ck::f16_to_f32(k[i]);
    s[static_cast<size_t>(j)] = softcap > 0.0f ? softcap * std::tanh(scale * d / softcap) : scale * d;
    m = std::max(m, s[static_cast<size_t>(j)]);
  }
  out.assign(static_cast<size_t>(D), 0.0);
  double l = 0;
  for (int32_t j = lo; j <= pos; ++j) {
    const double p = std::exp(s[static_cast<size_t>(j)] - m);
    l += p;
    const f16* v = &c.v_cont[(static_cast<size_t>(seq) * c.ctx_cap + j) * row + static_cast<size_t>(kvh) * D];
    for (int32_t i = 0; i < D; ++i) out[static_cast<size_t>(i)] += p * ck::f16_to_f32(v[i]);
  }
  for (auto& o : out) o /= l;
}

// Runs GPU paged (or contiguous) attention for `rows`, returns [T, n_heads, D].
std::vector<float> gpu_attention(const Cache& c, const DevCache& dc, const DevBuf<float>& dq, const Rows& rows,
                                 int32_t n_heads, bool paged, int32_t window = 0, float softcap = 0.0f) {
  const int32_t T = static_cast<int32_t>(rows.seq.size());
  DevBuf<int32_t> dseq(rows.seq), dpos(rows.pos);
  DevBuf<float> dout(static_cast<size_t>(T) * n_heads * c.head_dim);
  dout.poison();
  const size_t ws_bytes = ck::cuda::attention_workspace_bytes(T, n_heads, c.head_dim, rows.max_keys());
  DevBuf<unsigned char> ws(ws_bytes);
  ws.poison();
  const ck::cuda::AttentionLaunch l{rows.max_keys(), ws.get(), ws_bytes, nullptr};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (paged) {
    ck::PagedAttention a{dq.get(), dc.k_pages.get(), dc.v_pages.get(), dc.page_table.get(), dseq.get(), dpos.get(),
                         dout.get(), T, n_heads, c.n_kv, c.head_dim, c.head_dim, c.page_size, c.pt_stride,
                         c.num_pages, scale, window, softcap};
    ck::cuda::paged_attention(a, l);
  } else {
    ck::ContiguousAttention a{dq.get(), dc.k_cont.get(), dc.v_cont.get(), dseq.get(), dpos.get(), dout.get(),
                              T, n_heads, c.n_kv, c.head_dim, c.head_dim, c.ctx_cap, scale, window, softcap};
    ck::cuda::contiguous_attention(a, l);
  }
  return dout.download();
}

void check_attention(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, int32_t n_heads, int32_t n_kv,
                     int32_t head_dim, int32_t page_size) {
  const std::string tag = "h" + std::to_string(n_heads) + "/kv" + std::to_string(n_kv) + "/d" +
                          std::to_string(head_dim) + "/ps" + std::to_string(page_size);
  // Lengths straddle split (kAttnSplitKeys) and page boundaries; one long sequence.
  std::uniform_int_distribution<int32_t> len_d(1, 700);
  std::vector<int32_t> lens = {1, ck::cuda::kAttnSplitKeys, ck::cuda::kAttnSplitKeys + 1, 1500};
  for (int i = 0; i < 4; ++i) lens.push_back(len_d(rng));
  const Cache c = make_cache(rng, lens, n_kv, head_dim, page_size);
  const DevCache dc(c);
  // Rows: a decode row per sequence (pos = len - 1) plus a prefill chunk of
  // 24 rows ending at the long sequence's last key.
  Rows rows;
  for (int32_t s = 0; s < c.S; ++s) {
    rows.seq.push_back(s);
    rows.pos.push_back(lens[static_cast<size_t>(s)] - 1);
  }
  for (int32_t p = lens[3] - 24; p < lens[3]; ++p) {
    rows.seq.push_back(3);
    rows.pos.push_back(p);
  }
  const int32_t T = static_cast<int32_t>(rows.seq.size());
  const std::vector<float> q = randn(rng, static_cast<size_t>(T) * n_heads * head_dim);
  DevBuf<float> dq(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  const std::vector<float> gpu_paged = gpu_attention(c, dc, dq, rows, n_heads, true);
  const std::vector<float> gpu_cont = gpu_attention(c, dc, dq, rows, n_heads, false);
  std::vector<float> cpu(gpu_paged.size(), NAN);
  const ck::PagedAttention a{q.data(), c.k_pages.data(), c.v_pages.data(), c.page_table.data(), rows.seq.data(),
                             rows.pos.data(), cpu.data(), T, n_heads, n_kv, head_dim, head_dim, page_size,
                             c.pt_stride, c.num_pages, scale};
  ck::paged_attention(a, pool);
  std::vector<float> f64(gpu_paged.size());
  std::vector<double> o;
  for (int32_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < n_heads; ++h) {
      const size_t off = (static_cast<size_t>(t) * n_heads + h) * head_dim;
      attention_f64(c, &q[off], rows.seq[static_cast<size_t>(t)], rows.pos[static_cast<size_t>(t)],
                    h / (n_heads / n_kv), scale, o);
      for (int32_t i = 0; i < head_dim; ++i) f64[off + static_cast<size_t>(i)] = static_cast<float>(o[static_cast<size_t>(i)]);
    }
  const Diff vs_cpu = compare(gpu_paged, cpu), vs_f64 = compare(gpu_paged, f64), cpu_f64 = compare(cpu, f64);
  tally.check(vs_cpu.non_finite == 0 && vs_cpu.rel_l2 < 1e-5, "paged attention vs CPU " + tag, vs_cpu.str());
  tally.check(vs_f64.non_finite == 0 && vs_f64.rel_l2 < 1e-5, "paged attention vs f64 " + tag,
              vs_f64.str() + " (CPU vs f64 rel_l2=" + std::to_string(cpu_f64.rel_l2) + ")");
  tally.check(same_bits(gpu_paged.data(), gpu_cont.data(), gpu_paged.size()),
              "paged == contiguous bit-exact " + tag, "shuffled, fragmented page table");

  // Batch invariance: one target row alone, then inside batches of 2..16 at a
  // random index among random neighbours (other sequences and positions).
  const int32_t target_seq = 3, target_pos = lens[3] - 1;
  const size_t qrow = static_cast<size_t>(n_heads) * head_dim;
  const std::vector<float> qt = randn(rng, qrow);
  DevBuf<float> dq1(qt);
  const std::vector<float> alone = gpu_attention(c, dc, dq1, Rows{{target_seq}, {target_pos}}, n_heads, true);
  int32_t differing = 0;
  for (int32_t B = 2; B <= 16; ++B) {
    std::uniform_int_distribution<int32_t> at_d(0, B - 1), seq_d(0, c.S - 1);
    const int32_t at = at_d(rng);
    Rows batch;
    std::vector<float> qb = randn(rng, static_cast<size_t>(B) * qrow);
    for (int32_t b = 0; b < B; ++b) {
      if (b == at) {
        batch.seq.push_back(target_seq);
        batch.pos.push_back(target_pos);
        std::copy(qt.begin(), qt.end(), qb.begin() + static_cast<std::ptrdiff_t>(b * qrow));
      } else {
        const int32_t s = seq_d(rng);
        std::uniform_int_distribution<int32_t> pos_d(0, lens[static_cast<size_t>(s)] - 1);
        batch.seq.push_back(s);
        batch.pos.push_back(pos_d(rng));
      }
    }
    DevBuf<float> dqb(qb);
    const std::vector<float> out = gpu_attention(c, dc, dqb, batch, n_heads, true);
    if (!same_bits(alone.data(), &out[static_cast<size_t>(at) * qrow], qrow)) ++differing;
  }
  tally.check(differing == 0, "attention batch invariance " + tag,
              "row alone vs batches 2..16: " + std::to_string(differing) + " of 15 differ");
}

// Sliding windows (shorter than a split, and crossing split boundaries) and
// soft-capped scores: GPU vs CPU and float64, paged == contiguous bits, and
// a row's bits alone vs inside a batch.
void check_attention_layouts(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, int32_t window,
                             float softcap) {
  const int32_t n_heads = 8, n_kv = 2, head_dim = 128, page_size = 16;
  const std::string tag = "window " + std::to_string(window) + " softcap " + std::to_string(softcap);
  const std::vector<int32_t> lens = {30, ck::cuda::kAttnSplitKeys + 7, 1700, 2 * ck::cuda::kAttnSplitKeys};
  const Cache c = make_cache(rng, lens, n_kv, head_dim, page_size);
  const DevCache dc(c);
  Rows rows;
  for (int32_t s = 0; s < c.S; ++s) {
    rows.seq.push_back(s);
    rows.pos.push_back(lens[static_cast<size_t>(s)] - 1);
  }
  for (int32_t p = 1000; p < 1016; ++p) rows.seq.push_back(2), rows.pos.push_back(p);
  const int32_t T = static_cast<int32_t>(rows.seq.size());
  const std::vector<float> q = randn(rng, static_cast<size_t>(T) * n_heads * head_dim);
  DevBuf<float> dq(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::vector<float> gpu_paged = gpu_attention(c, dc, dq, rows, n_heads, true, window, softcap);
  const std::vector<float> gpu_cont = gpu_attention(c, dc, dq, rows, n_heads, false, window, softcap);
  std::vector<float> cpu(gpu_paged.size(), NAN);
  const ck::PagedAttention a{q.data(), c.k_pages.data(), c.v_pages.data(), c.page_table.data(), rows.seq.data(),
                             rows.pos.data(), cpu.data(), T, n_heads, n_kv, head_dim, head_dim, page_size,
                             c.pt_stride, c.num_pages, scale, window, softcap};
  ck::paged_attention(a, pool);
  std::vector<float> f64(gpu_paged.size());
  std::vector<double> o;
  for (int32_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < n_heads; ++h) {
      const size_t off = (static_cast<size_t>(t) * n_heads + h) * head_dim;
      attention_f64(c, &q[off], rows.seq[static_cast<size_t>(t)], rows.pos[static_cast<size_t>(t)],
                    h / (n_heads / n_kv), scale, o, window, softcap);
      for (int32_t i = 0; i < head_dim; ++i) f64[off + static_cast<size_t>(i)] = static_cast<float>(o[static_cast<size_t>(i)]);
    }
  const Diff vs_cpu = compare(gpu_paged, cpu), vs_f64 = compare(gpu_paged, f64);
  tally.check(vs_cpu.non_finite == 0 && vs_cpu.rel_l2 < 1e-5, "attention vs CPU, " + tag, vs_cpu.str());
  tally.check(vs_f64.non_finite == 0 && vs_f64.rel_l2 < 1e-5, "attention vs f64, " + tag, vs_f64.str());
  tally.check(same_bits(gpu_paged.data(), gpu_cont.data(), gpu_paged.size()), "paged == contiguous bit-exact, " + tag,
              "shuffled, fragmented page table");
  // The long sequence's last row alone, then as row 3 of a batch of the others.
  const size_t qrow = static_cast<size_t>(n_heads) * head_dim;
  DevBuf<float> dq1(std::vector<float>(q.begin() + 2 * static_cast<std::ptrdiff_t>(qrow),
                                       q.begin() + 3 * static_cast<std::ptrdiff_t>(qrow)));
  const std::vector<float> alone = gpu_attention(c, dc, dq1, Rows{{2}, {lens[2] - 1}}, n_heads, true, window, softcap);
  tally.check(same_bits(alone.data(), &gpu_paged[2 * qrow], qrow), "attention batch invariance, " + tag,
              "row alone vs in a batch of " + std::to_string(T));
}

// Chunking invariance: a prompt's rows computed in one call vs in chunks
// (each chunk with only its own rows) give the same bits.
void check_attention_chunking(Tally& tally, std::mt19937_64& rng) {
  const int32_t n_heads = 32, n_kv = 8, head_dim = 128, len = 777;
  const Cache c = make_cache(rng, {len}, n_kv, head_dim, 16);
  const DevCache dc(c);
  const size_t qrow = static_cast<size_t>(n_heads) * head_dim;
  const std::vector<float> q = randn(rng, static_cast<size_t>(len) * qrow);
  Rows all;
  for (int32_t p = 0; p < len; ++p) {
    all.seq.push_back(0);
    all.pos.push_back(p);
  }
  DevBuf<float> dq(q);
  const std::vector<float> whole = gpu_attention(c, dc, dq, all, n_heads, true);
  bool same = true;
  for (int32_t p0 = 0; p0 < len;) {
    const int32_t n = std::min(len - p0, 1 + static_cast<int32_t>(rng() % 300));
    Rows chunk;
    for (int32_t p = p0; p < p0 + n; ++p) {
      chunk.seq.push_back(0);
      chunk.pos.push_back(p);
    }
    DevBuf<float> dqc(std::vector<float>(q.begin() + static_cast<std::ptrdiff_t>(p0 * qrow),
                                         q.begin() + static_cast<std::ptrdiff_t>((p0 + n) * qrow)));
    const std::vector<float> part = gpu_attention(c, dc, dqc, chunk, n_heads, true);
    same = same && same_bits(part.data(), &whole[static_cast<size_t>(p0) * qrow], part.size());
    p0 += n;
  }
  tally.check(same, "attention prefill chunking invariance", "777-token prompt, random chunk sizes");
}

// ---- dense ops ------------------------------------------------------------------

void check_rmsnorm(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, ck::DType wt) {
  const int32_t T = 33, D = 4096;
  Weights w(rng, D, wt, 1.0f);
  const std::vector<float> x = randn(rng, static_cast<size_t>(T) * D, 2.0f);
  std::vector<float> cpu(x.size(), NAN);
  ck::rmsnorm(x.data(), w.host(), wt, T, D, 1e-5f, cpu.data(), pool);
  DevBuf<float> dx(x), dy(x.size());
  dy.poison();
  ck::cuda::rmsnorm(dx.get(), w.dev, wt, T, D, 1e-5f, dy.get(), nullptr);
  const Diff d = compare(dy.download(), cpu);
  tally.check(d.non_finite == 0 && d.rel_l2 < 1e-6, std::string("rmsnorm vs CPU ") + dtype_name(wt), d.str());
}

void check_rope_swiglu_embed(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool) {
  {
    const int32_t T = 40, n_heads = 32, head_dim = 128;
    std::vector<float> x = randn(rng, static_cast<size_t>(T) * n_heads * head_dim), inv_freq(head_dim / 2);
    for (int32_t i = 0; i < head_dim / 2; ++i)
      inv_freq[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / head_dim);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 131072);
    pos[0] = 0;
    DevBuf<float> dx(x), dinv(inv_freq);
    DevBuf<int32_t> dpos(pos);
    ck::rope(x.data(), T, n_heads, head_dim, pos.data(), inv_freq.data(), pool);
    ck::cuda::rope(dx.get(), T, n_heads, head_dim, dpos.get(), dinv.get(), nullptr);
    const Diff d = compare(dx.download(), x);
    tally.check(d.non_finite == 0 && d.rel_l2 < 1e-6, "rope vs CPU (pos up to 131072)", d.str());
  }
  {
    const int32_t T = 19, F = 14336;
    const std::vector<float> g = randn(rng, static_cast<size_t>(T) * F, 3.0f), u = randn(rng, g.size());
    std::vector<float> cpu(g.size(), NAN);
    ck::swiglu(g.data(), u.data(), T, F, cpu.data(), pool);
    DevBuf<float> dg(g), du(u), dout(g.size());
    dout.poison();
    ck::cuda::swiglu(dg.get(), du.get(), T, F, dout.get(), nullptr);
    const Diff d = compare(dout.download(), cpu);
    tally.check(d.non_finite == 0 && d.rel_l2 < 1e-6, "swiglu vs CPU", d.str());
  }
  for (ck::DType wt : {ck::DType::F32, ck::DType::F16, ck::DType::BF16}) {
    const int32_t vocab = 5000, D = 2048, T = 50;
    Weights emb(rng, static_cast<size_t>(vocab) * D, wt, 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& i : ids) i = static_cast<int32_t>(rng() % vocab);
    std::vector<float> cpu(static_cast<size_t>(T) * D, NAN);
    ck::embed(ids.data(), T, emb.host(), wt, D, cpu.data(), pool);
    DevBuf<int32_t> dids(ids);
    DevBuf<float> dout(cpu.size());
    dout.poison();
    ck::cuda::embed(dids.get(), T, emb.dev, wt, vocab, D, dout.get(), nullptr);
    const std::vector<float> gpu = dout.download();
    tally.check(same_bits(gpu.data(), cpu.data(), cpu.size()), std::string("embed bit-exact ") + dtype_name(wt),
                "gather + exact conversion");
  }
}

void timings(std::mt19937_64& rng, bool quick) {
  const int reps = quick ? 10 : 30;
  std::printf("\n== timings (median of %d, CUDA events)\n", reps);
  // Device copy bandwidth: bytes read + written by a large D2D copy.
  const size_t copy_bytes = size_t{1} << 31;
  double copy_gbs = 0;
  {
    DevBuf<unsigned char> src(copy_bytes), dst(copy_bytes);
    CK_CUDA(cudaMemset(src.get(), 0x5a, copy_bytes));
    const double ms = time_ms(
        [&] { CK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice)); }, 3, reps);
    copy_gbs = 2.0 * copy_bytes / (ms * 1e6);
    std::printf("%-52s %9.3f ms %9.1f GB/s\n", "D2D copy 2 GiB (read + write)", ms, copy_gbs);
  }
  // Paged decode attention, context 8192, batch 8, Llama-3-8B heads.
  double paged_gbs = 0, cont_gbs = 0;
  {
    const int32_t B = 8, ctx = 8192, n_heads = 32, n_kv = 8, head_dim = 128;
    const Cache c = make_cache(rng, std::vector<int32_t>(B, ctx), n_kv, head_dim, 16);
    const DevCache dc(c);
    Rows rows;
    for (int32_t b = 0; b < B; ++b) {
      rows.seq.push_back(b);
      rows.pos.push_back(ctx - 1);
    }
    DevBuf<float> dq(randn(rng, static_cast<size_t>(B) * n_heads * head_dim));
    DevBuf<int32_t> dseq(rows.seq), dpos(rows.pos);
    DevBuf<float> dout(static_cast<size_t>(B) * n_heads * head_dim);
    const size_t ws_bytes = ck::cuda::attention_workspace_bytes(B, n_heads, head_dim, ctx);
    DevBuf<unsigned char> ws(ws_bytes);
    const ck::cuda::AttentionLaunch l{ctx, ws.get(), ws_bytes, nullptr};
    const float scale = 1.0f / std::sqrt(128.0f);
    const double kv_bytes = 2.0 * B * ctx * n_kv * head_dim * 2;
    const ck::PagedAttention pa{dq.get(), dc.k_pages.get(), dc.v_pages.get(), dc.page_table.get(), dseq.get(),
                                dpos.get(), dout.get(), B, n_heads, n_kv, head_dim, head_dim, 16, c.pt_stride,
                                c.num_pages, scale};
    const ck::ContiguousAttention ca{dq.get(), dc.k_cont.get(), dc.v_cont.get(), dseq.get(), dpos.get(), dout.get(),
                                     B, n_heads, n_kv, head_dim, head_dim, c.ctx_cap, scale};
    const double pms = time_ms([&] { ck::cuda::paged_attention(pa, l); }, 3, reps);
    const double cms = time_ms([&] { ck::cuda::contiguous_attention(ca, l); }, 3, reps);
    paged_gbs = kv_bytes / (pms * 1e6);
    cont_gbs = kv_bytes / (cms * 1e6);
    std::printf("%-52s %9.3f ms %9.1f GB/s\n", "paged decode attn ctx 8192 B 8 h32/kv8/d128 (KV read)", pms,
                paged_gbs);
    std::printf("%-52s %9.3f ms %9.1f GB/s\n", "contiguous decode attn, same", cms, cont_gbs);
  }
  const GemmTimes g = time_gemm(rng, quick, reps);
  std::printf("\n== table\n");
  std::printf("| figure | value |\n|---|---|\n");
  std::printf("| device copy bandwidth (D2D, read+write) | %.1f GB/s |\n", copy_gbs);
  std::printf("| paged decode attention, ctx 8192, batch 8 | %.1f GB/s (%.1f%% of copy; goal >= 80%%) |\n",
              paged_gbs, 100.0 * paged_gbs / copy_gbs);
  std::printf("| contiguous decode attention, same | %.1f GB/s (paged/contiguous %.3f) |\n", cont_gbs,
              paged_gbs / cont_gbs);
  if (g.cublas_tflops > 0)
    std::printf("| batch-invariant GEMM T=%d K=N=4096, f16 W | %.1f TFLOP/s (%.1f%% of cuBLAS %.1f; goal >= 60%%) |\n",
                quick ? 1024 : 4096, g.tflops_f16, 100.0 * g.tflops_f16 / g.cublas_tflops, g.cublas_tflops);
  else
    std::printf("| batch-invariant GEMM T=%d K=N=4096, f16 W | %.1f TFLOP/s (no cuBLAS in this build) |\n",
                quick ? 1024 : 4096, g.tflops_f16);
  std::printf("| batch-invariant GEMM, same, bf16 W | %.1f TFLOP/s |\n", g.tflops_bf16);
  const int32_t decode_t[3] = {1, 8, 32};
  for (int i = 0; i < 3; ++i)
    std::printf("| batch-invariant GEMM decode T=%d, f16 W | %.1f GB/s of weights (%.1f%% of copy; goal >= 70%%) |\n",
                decode_t[i], g.decode_gbs[i], 100.0 * g.decode_gbs[i] / copy_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else
      seed = std::strtoull(argv[i], nullptr, 10);
  }
  Tally tally;
  try {
    int dev = 0;
    CK_CUDA(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CK_CUDA(cudaGetDeviceProperties(&prop, dev));
    std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MB, %.1f GiB; seed %llu%s\n", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30), static_cast<unsigned long long>(seed),
                quick ? " (quick)" : "");
    std::mt19937_64 rng(seed);
    ck::ThreadPool pool(static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
    check_conversions(tally, rng, quick);
    check_append(tally, rng, &pool);
    check_attention(tally, rng, &pool, 32, 8, 128, 16);
    check_attention(tally, rng, &pool, 28, 4, 128, 16);  // G = 7, not a power of two
    check_attention(tally, rng, &pool, 8, 8, 64, 32);    // MHA, head_dim 64
    check_attention(tally, rng, &pool, 16, 1, 256, 16);  // G = 16, head_dim 256
    check_attention_chunking(tally, rng);
    check_attention_layouts(tally, rng, &pool, 100, 0.0f);   // a window inside one split
    check_attention_layouts(tally, rng, &pool, 700, 0.0f);   // windows crossing split boundaries
    check_attention_layouts(tally, rng, &pool, 0, 30.0f);    // Gemma 2's soft-cap, global
    check_attention_layouts(tally, rng, &pool, 600, 5.0f);   // both
    for (ck::DType wt : {ck::DType::F32, ck::DType::F16, ck::DType::BF16}) check_matmul(tally, rng, &pool, wt);
    for (ck::DType wt : {ck::DType::F32, ck::DType::BF16}) check_rmsnorm(tally, rng, &pool, wt);
    check_rope_swiglu_embed(tally, rng, &pool);
    check_transfers(tally, rng);
    // Its own catch, so an engine failure still leaves the kernel timings.
    try {
      check_engine(tally, rng);
      check_engine_invariance(tally, rng);
    } catch (const std::exception& e) {
      tally.check(false, "engine: uncaught error", e.what());
    }
    CK_CUDA(cudaDeviceSynchronize());
    timings(rng, quick);
  } catch (const std::exception& e) {
    std::printf("FAIL %-44s %s\n", "uncaught error", e.what());
    tally.failed++;
  }
#if !defined(CK_HAVE_CUBLAS)
  std::printf("note: built without cuBLAS headers; the cuBLAS path was not checked\n");
#endif
  std::printf("\n%d passed, %d failed\n", tally.passed, tally.failed);
  return tally.failed == 0 ? 0 : 1;
}
