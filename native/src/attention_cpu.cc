// The CPU backend's attention kernels (kernels.h: paged_attention,
// contiguous_attention, attention_exp), apart from the dense ops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_simd.h"
#include "cpu.h"
#include "thread_pool.h"

namespace ck {

// ---- attention -------------------------------------------------------------
//
// The G = n_heads / n_kv query heads that share a kv head are computed
// together, so each K/V row is read once per row t. For each head g, over the
// L = pos - lo + 1 keys j = lo..pos of the row's window (kernels.h):
//   s_j = scale * (q_g · k_j)
//   s_j = softcap * tanh_poly(s_j / softcap)  (softcap > 0 only)
//   m   = max_j s_j
//   p_j = exp(s_j - m),  l = sum_j p_j
//   out = (sum_j p_j v_j) / l                 (j ascending, per lane)
// Each element's order of operations is fixed by the primitives below
// (attention_simd.h on the vector paths; plain loops, j ascending, with
// std::exp on the portable one) and never depends on where the keys' rows
// are, so the key locator — the only difference between the paged and
// contiguous versions — cannot change a bit. It answers in runs: key j's K
// and V rows (kv head 0) and how many keys from j on sit at consecutive
// slots (to the end of j's page, or of the context), so the page table is
// read and divided once per page, not once per key and head. The runs fill
// spans of kSpanKeys row addresses, and both versions run the same
// primitive calls over the same spans.

namespace {

// s[g * s_stride + j] = scale * (q_g · k_j) for g < G, j < n, k_j = k[j] + k_off.
inline void attention_scores(const float* q, int64_t q_stride, int32_t G, const f16* const* k, int64_t k_off,
                             int32_t n, int32_t d, float scale, float* s, int64_t s_stride) {
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() == Isa::Avx512) return avx512::attention_scores(q, q_stride, G, k, k_off, n, d, scale, s, s_stride);
  if (active_isa() == Isa::Avx2) return avx2::attention_scores(q, q_stride, G, k, k_off, n, d, scale, s, s_stride);
#endif
  for (int32_t g = 0; g < G; ++g)
    for (int32_t j = 0; j < n; ++j) s[g * s_stride + j] = scale * generic::dot_f16(q + g * q_stride, k[j] + k_off, d);
}

// s_j <- exp(s_j - max s) in place over [0, L); returns their sum.
inline float softmax_numerators(float* s, int32_t L) {
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() != Isa::Generic) return avx2::softmax_numerators(s, L);
#endif
  float m = s[0];
  for (int32_t j = 1; j < L; ++j) m = std::max(m, s[j]);
  float l = 0.0f;
  for (int32_t j = 0; j < L; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  return l;
}

// o_g += p_g[j] v_j for j < n in order, g < G, v_j = v[j] + v_off.
inline void attention_values(const float* p, int64_t p_stride, int32_t G, const f16* const* v, int64_t v_off,
                             int32_t n, int32_t d, float* o, int64_t o_stride) {
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() == Isa::Avx512) return avx512::attention_values(p, p_stride, G, v, v_off, n, d, o, o_stride);
  if (active_isa() == Isa::Avx2) return avx2::attention_values(p, p_stride, G, v, v_off, n, d, o, o_stride);
#endif
  for (int32_t j = 0; j < n; ++j)
    for (int32_t g = 0; g < G; ++g) generic::axpy_f16(p[g * p_stride + j], v[j] + v_off, o + g * o_stride, d);
}

struct AttentionShape {
  int32_t T, n_heads, n_kv, head_dim, v_head_dim;
  float scale;
  int32_t window;  // 0: global
  float softcap;   // 0: none
};

// Scratch reused across items by one thread: scores [NH, L], sums [NH].
thread_local std::vector<float> tl_scores;
thread_local std::vector<float> tl_sums;

// A run of keys: rows j .. j + n - 1 start at k / v (kv head 0) and step by
// one slot.
struct KeyRun {
  const f16* k;
  const f16* v;
  int32_t n;
};

// Keys per primitive call, for both layouts: a span's value rows for one kv
// head (kSpanKeys · v_head_dim · 2 bytes) stay in L1 while the value loop
// walks them once per block of lanes, and the paged and contiguous versions
// make the same calls, differing only in the row addresses.
constexpr int32_t kSpanKeys = 32;

// Keys j0 .. j0 + n - 1: where each one's K and V rows start (kv head 0).
struct KeySpan {
  const f16* k[kSpanKeys];
  const f16* v[kSpanKeys];
  int32_t n;
};

// Asks for `bytes` bytes from rows[r] + off on, r < n, into the cache (a
// hint: no fault, no effect on results).
inline void prefetch_span(const f16* const* rows, int32_t n, int64_t off, int64_t bytes) {
  for (int32_t r = 0; r < n; ++r) {
    const char* c = reinterpret_cast<const char*>(rows[r] + off);
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
  }
}

template <typename Locate>
void attend(const AttentionShape& sh, const float* q, const int32_t* row_pos, float* out, Locate locate,
            ThreadPool* pool) {
  const int32_t G = sh.n_heads / sh.n_kv;
  const int64_t k_row = static_cast<int64_t>(sh.n_kv) * sh.head_dim;
  const int64_t v_row = static_cast<int64_t>(sh.n_kv) * sh.v_head_dim;
  // Work item: (row t, a block of KB consecutive kv heads). A key's K (and V)
  // rows for those heads are adjacent in memory, so an item streams through
  // its keys sequentially instead of striding over the other heads. KB only
  // groups work: each head's arithmetic is the same for any KB, so the
  // choice (enough items to feed the threads) never changes a bit.
  const int64_t threads = pool != nullptr ? pool->threads() : 1;
  const int32_t blocks = static_cast<int32_t>(
      std::min<int64_t>(sh.n_kv, std::max<int64_t>(1, (4 * threads + sh.T - 1) / std::max(1, sh.T))));
  const int32_t KB = (sh.n_kv + blocks - 1) / blocks;
  const int32_t per_row = (sh.n_kv + KB - 1) / KB;
  const int64_t items = static_cast<int64_t>(sh.T) * per_row;
  parallel_for(pool, items, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const int32_t t = static_cast<int32_t>(item / per_row);
      const int32_t kv0 = static_cast<int32_t>(item % per_row) * KB;
      const int32_t kvn = std::min(KB, sh.n_kv - kv0);
      const int32_t NH = kvn * G;  // query heads of this item, h = kv0 * G + hh
      // The row's keys: absolute positions lo .. pos, L of them; below, key
      // index jr counts from lo (absolute position lo + jr).
      const int32_t pos = row_pos[t];
      const int32_t lo = sh.window > 0 ? std::max(0, pos - sh.window + 1) : 0;
      const int32_t L = pos - lo + 1;
      const float* qb = q + (static_cast<int64_t>(t) * sh.n_heads + static_cast<int64_t>(kv0) * G) * sh.head_dim;
      float* ob = out + (static_cast<int64_t>(t) * sh.n_heads + static_cast<int64_t>(kv0) * G) * sh.v_head_dim;
      std::vector<float>& scores = tl_scores;
      if (scores.size() < static_cast<size_t>(NH) * L) scores.resize(static_cast<size_t>(NH) * L);
      // Fills `sp` with keys j0 .. j0 + min(kSpanKeys, L - j0) - 1 (counted
      // from lo), asking the locator run by run (a span may cross pages).
      auto span_at = [&](int32_t j0, KeySpan& sp) {
        sp.n = std::min(kSpanKeys, L - j0);
        for (int32_t jj = 0; jj < sp.n;) {
          const KeyRun run = locate(t, lo + j0 + jj, sp.n - jj);
          for (int32_t r = 0; r < run.n; ++r, ++jj) {
            sp.k[jj] = run.k + r * k_row;
            sp.v[jj] = run.v + r * v_row;
          }
        }
      };
      // Walks the spans in order: body(j0, span, next span or nullptr).
      KeySpan spans[2];
      auto for_spans = [&](auto&& body) {
        int32_t c = 0;
        span_at(0, spans[0]);
        for (int32_t j0 = 0; j0 < L; j0 += spans[c].n, c ^= 1) {
          const bool more = j0 + spans[c].n < L;
          if (more) span_at(j0 + spans[c].n, spans[c ^ 1]);
          body(j0, spans[c], more ? &spans[c ^ 1] : nullptr);
        }
      };
      // Pass 1: s_j = scale * (q_h . k_j), stored head-major [NH, L]. Before
      // a kv head's keys of one span are read, the same head's keys of the
      // next span (the next pages, anywhere in the pool) are prefetched: the
      // hardware prefetcher does not follow a jump, and spreading the
      // requests over the span keeps memory busy while the FMAs run.
      for_spans([&](int32_t j0, const KeySpan& sp, const KeySpan* next) {
        for (int32_t kk = 0; kk < kvn; ++kk) {
          const int64_t head = static_cast<int64_t>(kv0 + kk) * sh.head_dim;
          if (next != nullptr) prefetch_span(next->k, next->n, head, sh.head_dim * 2);
          attention_scores(qb + static_cast<int64_t>(kk) * G * sh.head_dim, sh.head_dim, G, sp.k, head, sp.n,
                           sh.head_dim, sh.scale, scores.data() + static_cast<size_t>(kk) * G * L + j0, L);
        }
      });
      // Soft-capping, element by element (Gemma 2's attn_logit_softcapping).
      if (sh.softcap > 0.0f) {
        float* sc = scores.data();
        for (int64_t i = 0; i < static_cast<int64_t>(NH) * L; ++i) sc[i] = sh.softcap * generic::tanh_poly(sc[i] / sh.softcap);
      }
      // Pass 2: per head, p_j = exp(s_j - m) in place and l = sum_j p_j;
      // the head's output starts at zero.
      std::vector<float>& sums = tl_sums;
      if (sums.size() < static_cast<size_t>(NH)) sums.resize(static_cast<size_t>(NH));
      for (int32_t hh = 0; hh < NH; ++hh) {
        sums[static_cast<size_t>(hh)] = softmax_numerators(scores.data() + static_cast<size_t>(hh) * L, L);
        float* o = ob + static_cast<int64_t>(hh) * sh.v_head_dim;
        std::fill(o, o + sh.v_head_dim, 0.0f);
      }
      // Pass 3: o_h += p_j v_j, j ascending, per span and kv head (the next
      // span's value rows prefetched as in pass 1).
      for_spans([&](int32_t j0, const KeySpan& sp, const KeySpan* next) {
        for (int32_t kk = 0; kk < kvn; ++kk) {
          const int64_t head = static_cast<int64_t>(kv0 + kk) * sh.v_head_dim;
          if (next != nullptr) prefetch_span(next->v, next->n, head, sh.v_head_dim * 2);
          attention_values(scores.data() + static_cast<size_t>(kk) * G * L + j0, L, G, sp.v, head, sp.n,
                           sh.v_head_dim, ob + static_cast<int64_t>(kk) * G * sh.v_head_dim, sh.v_head_dim);
        }
      });
      for (int32_t hh = 0; hh < NH; ++hh) {
        const float inv = 1.0f / sums[static_cast<size_t>(hh)];
        float* o = ob + static_cast<int64_t>(hh) * sh.v_head_dim;
        for (int32_t d = 0; d < sh.v_head_dim; ++d) o[d] *= inv;
      }
    }
  });
}

}  // namespace

void paged_attention(const PagedAttention& a, ThreadPool* pool) {
  const AttentionShape sh{a.T, a.n_heads, a.n_kv, a.head_dim, a.v_head_dim, a.scale, a.window, a.softcap};
  const int64_t k_row = static_cast<int64_t>(a.n_kv) * a.head_dim;
  const int64_t v_row = static_cast<int64_t>(a.n_kv) * a.v_head_dim;
  const int32_t ps = a.page_size;
  // Keys j .. up to the end of j's page (at most `left`).
  auto locate = [&](int32_t t, int32_t j, int32_t left) {
    const int64_t page = a.page_table[static_cast<int64_t>(a.row_seq[t]) * a.pt_stride + j / ps];
    const int32_t off = j % ps;
    const int64_t slot = page * ps + off;
    return KeyRun{a.k_pages + slot * k_row, a.v_pages + slot * v_row, std::min(left, ps - off)};
  };
  attend(sh, a.q, a.row_pos, a.out, locate, pool);
}

void contiguous_attention(const ContiguousAttention& a, ThreadPool* pool) {
  const AttentionShape sh{a.T, a.n_heads, a.n_kv, a.head_dim, a.v_head_dim, a.scale, a.window, a.softcap};
  const int64_t k_row = static_cast<int64_t>(a.n_kv) * a.head_dim;
  const int64_t v_row = static_cast<int64_t>(a.n_kv) * a.v_head_dim;
  // Keys j .. pos are consecutive: one run.
  auto locate = [&](int32_t t, int32_t j, int32_t left) {
    const int64_t slot = static_cast<int64_t>(a.row_seq[t]) * a.ctx_cap + j;
    return KeyRun{a.k + slot * k_row, a.v + slot * v_row, left};
  };
  attend(sh, a.q, a.row_pos, a.out, locate, pool);
}

void attention_exp(const float* x, float* y, int64_t n) {
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() != Isa::Generic) return avx2::exp_nonpositive(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

}  // namespace ck
