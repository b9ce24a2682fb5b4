// GPU check harness: every CUDA kernel against the CPU backend (the same
// kernels.h functions, linked from native/src) on fresh random data, the
// determinism checks on the GPU, the page transfers, then timings against
// the device copy bandwidth measured in the same run.
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

namespace {

using ck::f16;

// ---- small infrastructure ---------------------------------------------------

template <class T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) { CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    CK_REQUIRE(h.size() == n_, "DevBuf::upload: size mismatch");
    CK_CUDA(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // All-ones bytes: NaN as f32 and as f16, so an unwritten output is caught.
  void poison() { CK_CUDA(cudaMemset(p_, 0xff, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

struct Tally {
  int passed = 0, failed = 0;
  void check(bool ok, const std::string& name, const std::string& detail) {
    std::printf("%s %-44s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
    std::fflush(stdout);
    (ok ? passed : failed)++;
  }
};

struct Diff {
  double max_abs = 0, rel_l2 = 0;  // rel_l2 = ||gpu - ref|| / ||ref||
  int64_t non_finite = 0;          // GPU outputs that are NaN/inf (poison left, or a bug)
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "max_abs=%.3e rel_l2=%.3e non_finite=%lld", max_abs, rel_l2,
                  static_cast<long long>(non_finite));
    return b;
  }
};

Diff compare(const std::vector<float>& gpu, const std::vector<float>& ref) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) {
      ++d.non_finite;
      continue;
    }
    const double e = static_cast<double>(gpu[i]) - ref[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

std::vector<float> randn(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<f16> rand_f16(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::vector<f16> v(n);
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& h : v) h = ck::f32_to_f16(nd(rng));
  return v;
}

std::vector<uint16_t> to_weight(const std::vector<float>& w, ck::DType wt) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (wt == ck::DType::F16) {
      out[i] = ck::f32_to_f16(w[i]);
    } else {  // bf16, round to nearest even
      uint32_t u;
      std::memcpy(&u, &w[i], 4);
      out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  return out;
}

const char* dtype_name(ck::DType t) { return t == ck::DType::F32 ? "f32" : t == ck::DType::F16 ? "f16" : "bf16"; }

// Weights of any dtype held on host and device.
struct Weights {
  ck::DType wt;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  void* dev = nullptr;
  Weights(std::mt19937_64& rng, size_t n, ck::DType t, float scale) : wt(t), f32(randn(rng, n, scale)) {
    size_t bytes = n * 4;
    const void* src = f32.data();
    if (t != ck::DType::F32) {
      half = to_weight(f32, t);
      bytes = n * 2;
      src = half.data();
    }
    CK_CUDA(cudaMalloc(&dev, bytes));
    CK_CUDA(cudaMemcpy(dev, src, bytes, cudaMemcpyHostToDevice));
  }
  ~Weights() { cudaFree(dev); }
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;
  const void* host() const { return wt == ck::DType::F32 ? static_cast<const void*>(f32.data()) : half.data(); }
};

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

void check_matmul(Tally& tally, std::mt19937_64& rng, ck::ThreadPool* pool, ck::DType wt) {
  const int32_t T = 77, K = 1000, N = 300;
  const std::string tag = std::string(dtype_name(wt));
  Weights W(rng, static_cast<size_t>(N) * K, wt, 0.05f);
  const std::vector<float> x = randn(rng, static_cast<size_t>(T) * K), bias = randn(rng, N);
  std::vector<float> cpu(static_cast<size_t>(T) * N, NAN), f64(cpu.size());
  ck::matmul(x.data(), T, K, W.host(), wt, N, bias.data(), cpu.data(), pool);
  for (int32_t t = 0; t < T; ++t)
    for (int32_t n = 0; n < N; ++n) {
      double s = bias[static_cast<size_t>(n)];
      for (int32_t k = 0; k < K; ++k) {
        const size_t wi = static_cast<size_t>(n) * K + k;
        const float w = wt == ck::DType::F32 ? W.f32[wi]
                        : wt == ck::DType::F16 ? ck::f16_to_f32(W.half[wi])
                                               : ck::bf16_to_f32(W.half[wi]);
        s += static_cast<double>(x[static_cast<size_t>(t) * K + k]) * w;
      }
      f64[static_cast<size_t>(t) * N + n] = static_cast<float>(s);
    }
  DevBuf<float> dx(x), db(bias), dy(cpu.size());
  dy.poison();
  ck::cuda::matmul(dx.get(), T, K, W.dev, wt, N, db.get(), dy.get(), nullptr);
  const std::vector<float> gpu = dy.download();
  const Diff vs_cpu = compare(gpu, cpu), vs_f64 = compare(gpu, f64);
  tally.check(vs_cpu.non_finite == 0 && vs_cpu.rel_l2 < 1e-5, "matmul vs CPU " + tag, vs_cpu.str());
  tally.check(vs_f64.non_finite == 0 && vs_f64.rel_l2 < 1e-5, "matmul vs f64 " + tag, vs_f64.str());

  // Batch invariance: row 0 alone, then at a random index of batches of
  // 2..16 and of 200 (several row tiles).
  DevBuf<float> y1(static_cast<size_t>(N));
  DevBuf<float> x1(std::vector<float>(x.begin(), x.begin() + K));
  ck::cuda::matmul(x1.get(), 1, K, W.dev, wt, N, db.get(), y1.get(), nullptr);
  const std::vector<float> alone = y1.download();
  int32_t differing = 0;
  std::vector<int32_t> sizes;
  for (int32_t B = 2; B <= 16; ++B) sizes.push_back(B);
  sizes.push_back(200);
  for (int32_t B : sizes) {
    std::vector<float> xb = randn(rng, static_cast<size_t>(B) * K);
    const int32_t at = static_cast<int32_t>(rng() % static_cast<uint64_t>(B));
    std::copy(x.begin(), x.begin() + K, xb.begin() + static_cast<std::ptrdiff_t>(at) * K);
    DevBuf<float> dxb(xb), dyb(static_cast<size_t>(B) * N);
    ck::cuda::matmul(dxb.get(), B, K, W.dev, wt, N, db.get(), dyb.get(), nullptr);
    const std::vector<float> yb = dyb.download();
    if (!same_bits(alone.data(), &yb[static_cast<size_t>(at) * N], static_cast<size_t>(N))) ++differing;
  }
  tally.check(differing == 0, "matmul batch invariance " + tag,
              "row alone vs batches 2..16, 200: " + std::to_string(differing) + " of 16 differ");

#if defined(CK_HAVE_CUBLAS)
  ck::cuda::CublasGemm gemm(nullptr, int64_t{256} * K);
  dy.poison();
  gemm.matmul(dx.get(), T, K, W.dev, wt, N, db.get(), dy.get());
  const std::vector<float> cb = dy.download();
  const Diff cb_f64 = compare(cb, f64);
  // f16/bf16 weights: x is rounded to the weight type first (2^-11 / 2^-8).
  const double tol = wt == ck::DType::F32 ? 1e-5 : wt == ck::DType::F16 ? 2e-3 : 1.5e-2;
  tally.check(cb_f64.non_finite == 0 && cb_f64.rel_l2 < tol, "cuBLAS GemmEx vs f64 " + tag, cb_f64.str());
#endif
}

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

// ---- page transfers ---------------------------------------------------------------

void check_transfers(Tally& tally, std::mt19937_64& rng) {
  const int32_t n_layers = 4, num_pages = 64, page_size = 16, n_kv = 8, head_dim = 128;
  const size_t page_elems = static_cast<size_t>(page_size) * n_kv * head_dim;
  std::vector<std::vector<f16>> hk, hv;
  std::vector<f16*> dk, dv;
  for (int32_t l = 0; l < n_layers; ++l) {
    hk.push_back(rand_f16(rng, page_elems * num_pages));
    hv.push_back(rand_f16(rng, page_elems * num_pages));
    f16 *k = nullptr, *v = nullptr;
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), page_elems * num_pages * 2));
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), page_elems * num_pages * 2));
    CK_CUDA(cudaMemcpy(k, hk.back().data(), page_elems * num_pages * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(v, hv.back().data(), page_elems * num_pages * 2, cudaMemcpyHostToDevice));
    dk.push_back(k);
    dv.push_back(v);
  }
  const ck::cuda::KvPools pools{n_layers, num_pages, page_elems * 2, page_elems * 2, dk.data(), dv.data()};
  const size_t bpp = ck::cuda::host_bytes_per_page(pools);
  cudaStream_t compute;
  CK_CUDA(cudaStreamCreate(&compute));
  {
    ck::cuda::PageTransfer xfer(pools, compute, 2, 8 * bpp);
    auto wait = [&](int32_t t) {
      while (xfer.poll(t) == ck::cuda::TransferState::Pending) std::this_thread::yield();
    };
    // Download 5 scattered pages; compare with the host copies.
    const std::vector<int32_t> pages = {17, 3, 60, 4, 33};
    std::vector<unsigned char> host(pages.size() * bpp, 0xab);
    const int32_t t1 = xfer.begin_download(pages.data(), 5, host.data());
    wait(t1);
    bool ok = true;
    for (size_t i = 0; i < pages.size(); ++i)
      for (int32_t l = 0; l < n_layers; ++l) {
        const unsigned char* p = host.data() + i * bpp + static_cast<size_t>(l) * 2 * page_elems * 2;
        ok = ok && std::memcmp(p, &hk[static_cast<size_t>(l)][static_cast<size_t>(pages[i]) * page_elems],
                               page_elems * 2) == 0;
        ok = ok && std::memcmp(p + page_elems * 2,
                               &hv[static_cast<size_t>(l)][static_cast<size_t>(pages[i]) * page_elems],
                               page_elems * 2) == 0;
      }
    tally.check(ok, "page download (5 pages x 4 layers)", "host image equals the pools, page-major");

    // Upload that image to other pages, copy them on, download, compare.
    const std::vector<int32_t> up = {40, 41, 2, 50, 9}, cp = {11, 12, 13, 14, 15};
    const int32_t t2 = xfer.begin_upload(up.data(), 5, host.data());
    wait(t2);
    const int32_t t3 = xfer.begin_copy(up.data(), cp.data(), 5);
    wait(t3);
    std::vector<unsigned char> back(host.size(), 0);
    const int32_t t4 = xfer.begin_download(cp.data(), 5, back.data());
    wait(t4);
    tally.check(back == host, "page upload + copy + download round trip", "bytes identical");

    // Slab bound: two slabs, the third concurrent transfer is refused.
    const int32_t a = xfer.begin_download(pages.data(), 1, host.data());
    const int32_t b = xfer.begin_download(pages.data(), 1, host.data());
    const int32_t c = xfer.begin_download(pages.data(), 1, host.data());
    tally.check(a >= 0 && b >= 0 && c == -1 && xfer.free_slabs() == 0, "pinned slab bound",
                "2 slabs: third transfer refused (-1)");
    xfer.drain();
    tally.check(xfer.free_slabs() == 2, "drain releases every slab", std::to_string(xfer.free_slabs()) + " free");

    // Bad input: a page out of range throws and queues nothing.
    const std::vector<int32_t> bad = {1, num_pages};
    bool threw = false;
    try {
      xfer.begin_upload(bad.data(), 2, host.data());
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    tally.check(threw && xfer.free_slabs() == 2, "transfer rejects a page out of range", "invalid_argument, no slab taken");
  }
  CK_CUDA(cudaStreamDestroy(compute));
  for (int32_t l = 0; l < n_layers; ++l) {
    CK_CUDA(cudaFree(dk[static_cast<size_t>(l)]));
    CK_CUDA(cudaFree(dv[static_cast<size_t>(l)]));
  }
}

// ---- timing ---------------------------------------------------------------------

// Median milliseconds of `reps` timed runs after `warm` untimed ones.
// ---- engines: the CUDA engine's step() against the CPU engine -----------------
// One small random model (GQA, q/k/v bias, weights in all three dtypes), the
// same weights loaded into both engines; a ragged prefill over shuffled,
// fragmented pages, then a decode step. The logits must agree to fp32
// rounding (the engines sum in different orders); on the GPU the paged path
// must give the same bits as its contiguous oracle; page transfers round-trip.
void check_engine(Tally& tally, std::mt19937_64& rng) {
  ck::ModelSpec m;
  m.n_layers = 2;
  m.hidden = 256;
  m.n_heads = 4;
  m.n_kv = 2;
  m.head_dim = 64;
  m.v_head_dim = 64;
  m.ffn = 512;
  m.vocab = 1000;
  m.rms_eps = 1e-5f;
  m.attention_bias = true;
  m.tied_embeddings = false;
  m.max_position = 1024;
  std::vector<float> inv(static_cast<size_t>(m.head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / m.head_dim));

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
    tally.check(d.non_finite == 0 && d.rel_l2 < 1e-3, std::string("engine: CUDA step() vs CPU, ") + what, d.str());
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
  // The CPU engine holds the same keys up to fp32 rounding before fp16: most bytes agree.
  std::vector<uint8_t> cpu_a(a.size());
  cpu.download_pages(src, cpu_a.data());
  size_t same = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) same += a[i] == cpu_a[i] && a[i + 1] == cpu_a[i + 1];
  const double frac = static_cast<double>(same) / static_cast<double>(a.size() / 2);
  char detail[64];
  std::snprintf(detail, sizeof detail, "%.1f%% of fp16 K/V values bit-equal", 100.0 * frac);
  tally.check(frac > 0.9, "engine: CUDA pages vs CPU pages", detail);
}

double time_ms(const std::function<void()>& fn, int warm, int reps) {
  for (int i = 0; i < warm; ++i) fn();
  CK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK_CUDA(cudaEventCreate(&a));
  CK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    CK_CUDA(cudaEventRecord(a));
    fn();
    CK_CUDA(cudaEventRecord(b));
    CK_CUDA(cudaEventSynchronize(b));
    CK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], a, b));
  }
  CK_CUDA(cudaEventDestroy(a));
  CK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
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
  // GEMM: deterministic kernel (and cuBLAS when built), f16 weights.
  double det_tflops = 0, det_decode_gbs = 0, cublas_tflops = 0;
  {
    const int32_t K = 4096, N = 4096, Tp = quick ? 1024 : 4096, Td = 8;
    Weights W(rng, static_cast<size_t>(N) * K, ck::DType::F16, 0.02f);
    DevBuf<float> x(randn(rng, static_cast<size_t>(Tp) * K)), y(static_cast<size_t>(Tp) * N);
    const double ms = time_ms([&] { ck::cuda::matmul(x.get(), Tp, K, W.dev, ck::DType::F16, N, nullptr, y.get(), nullptr); }, 2, reps);
    det_tflops = 2.0 * Tp * K * N / (ms * 1e9);
    std::printf("%-52s %9.3f ms %9.1f TFLOP/s\n",
                ("det. matmul T=" + std::to_string(Tp) + " K=N=4096 f16 W").c_str(), ms, det_tflops);
    const double dms = time_ms([&] { ck::cuda::matmul(x.get(), Td, K, W.dev, ck::DType::F16, N, nullptr, y.get(), nullptr); }, 2, reps);
    det_decode_gbs = 2.0 * K * N / (dms * 1e6);
    std::printf("%-52s %9.3f ms %9.1f GB/s (weights)\n", "det. matmul T=8 (decode) K=N=4096 f16 W", dms,
                det_decode_gbs);
    for (const int32_t Tx : {1, 32}) {  // the small-T kernel's ends (T <= 32)
      const double xms = time_ms([&] { ck::cuda::matmul(x.get(), Tx, K, W.dev, ck::DType::F16, N, nullptr, y.get(), nullptr); }, 2, reps);
      std::printf("%-52s %9.3f ms %9.1f GB/s (weights)\n",
                  ("det. matmul T=" + std::to_string(Tx) + " K=N=4096 f16 W").c_str(), xms, 2.0 * K * N / (xms * 1e6));
    }
#if defined(CK_HAVE_CUBLAS)
    ck::cuda::CublasGemm gemm(nullptr, int64_t{Tp} * K);
    const double cms = time_ms([&] { gemm.matmul(x.get(), Tp, K, W.dev, ck::DType::F16, N, nullptr, y.get()); }, 2, reps);
    cublas_tflops = 2.0 * Tp * K * N / (cms * 1e9);
    std::printf("%-52s %9.3f ms %9.1f TFLOP/s\n",
                ("cuBLAS GemmEx T=" + std::to_string(Tp) + " K=N=4096 f16 (x->f16 incl.)").c_str(), cms,
                cublas_tflops);
#endif
  }
  std::printf("\n== table\n");
  std::printf("| figure | value |\n|---|---|\n");
  std::printf("| device copy bandwidth (D2D, read+write) | %.1f GB/s |\n", copy_gbs);
  std::printf("| paged decode attention, ctx 8192, batch 8 | %.1f GB/s (%.1f%% of copy; goal >= 80%%) |\n",
              paged_gbs, 100.0 * paged_gbs / copy_gbs);
  std::printf("| contiguous decode attention, same | %.1f GB/s (paged/contiguous %.3f) |\n", cont_gbs,
              paged_gbs / cont_gbs);
  std::printf("| deterministic matmul, f16 W | %.2f TFLOP/s; decode T=8 %.1f GB/s of weights |\n", det_tflops,
              det_decode_gbs);
  if (cublas_tflops > 0) std::printf("| cuBLAS GemmEx, f16 | %.2f TFLOP/s |\n", cublas_tflops);
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
