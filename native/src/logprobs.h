// Log-probabilities of one row of logits the host holds (the sampler's and the
// scorer's rows): what the OpenAI API's logprobs and prompt scoring read.
// Same determinism contract as kernels.h: the result depends on the row
// alone, in a fixed order, so a row gives the same bits in any batch and on
// any instruction set (the exp-sum is generic::exp_sum or its AVX2 twin).
#pragma once

#include <cstdint>

namespace ck {

struct RowLogprobs {
  float max;       // the largest entry (-inf when every entry is -inf)
  double sum_exp;  // sum_i exp(x_i - max), cpu.h: exp_sum (exp in f32, sum in f64)
  int32_t rank;    // 1 + the number of entries strictly above x[token]
};

// The k most likely ids land in top[0..k), value descending, ties by lower id
// (the sampler's order); max and rank in the same pass over the row, the
// exp-sum in a second one. 0 <= token < n, 0 <= k <= n. log_softmax(x)[i] =
// x[i] - (max + log(sum_exp)); the caller takes the log (one per row).
RowLogprobs row_logprobs(const float* x, int32_t n, int32_t token, int32_t k, int32_t* top);

}  // namespace ck
