#include "logprobs.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu.h"

namespace ck {
namespace {

// Up to this k the top ids are kept by insertion into a sorted array (nearly
// every id costs one comparison with the worst kept); above it, a partial sort.
constexpr int32_t kInsertMax = 64;

double exp_sum(const float* x, int32_t n, float m) {
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() != Isa::Generic) return avx2::exp_sum(x, n, m);
#endif
  return generic::exp_sum(x, n, m);
}

}  // namespace

RowLogprobs row_logprobs(const float* x, int32_t n, int32_t token, int32_t k, int32_t* top) {
  const float chosen = x[token];
  float m = -std::numeric_limits<float>::infinity();
  int32_t above = 0;
  if (k <= kInsertMax) {
    float vals[kInsertMax];
    int32_t c = 0;  // kept so far
    for (int32_t i = 0; i < n; ++i) {
      const float v = x[i];
      m = v > m ? v : m;
      above += v > chosen ? 1 : 0;
      int32_t at;
      if (c < k) {
        at = c++;
      } else if (k > 0 && v > vals[k - 1]) {
        at = k - 1;  // the worst kept drops out
      } else {
        continue;
      }
      // Ids arrive ascending, so v goes after every kept value >= v (ties: lower id first).
      while (at > 0 && vals[at - 1] < v) {
        vals[at] = vals[at - 1];
        top[at] = top[at - 1];
        --at;
      }
      vals[at] = v;
      top[at] = i;
    }
  } else {
    for (int32_t i = 0; i < n; ++i) {
      const float v = x[i];
      m = v > m ? v : m;
      above += v > chosen ? 1 : 0;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    std::copy(ids.begin(), ids.begin() + k, top);
  }
  const double s = m == -std::numeric_limits<float>::infinity() ? 0.0 : exp_sum(x, n, m);
  return RowLogprobs{m, s, above + 1};
}

}  // namespace ck
