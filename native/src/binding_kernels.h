// The binding's `kernels` object: synchronous single-kernel hooks for tests
// and benchmarks (native/index.ts: Kernels), on one shared thread pool.
#pragma once

#include <napi.h>

#include "thread_pool.h"

namespace ck {

// The pool every hook runs on: default_threads() until kernels.setThreads(n).
ThreadPool* kernel_pool();

// Sets the kernel hooks on `k`: conversions, routed append, attention,
// matmul, norms, RoPE, activations, embedding, dequantization.
void add_kernel_hooks(Napi::Env env, Napi::Object k);
// Sets the yardsticks on `k` (binding_yardsticks.cc): memory bandwidth, FMA
// peak, and engine-allocated f16 memory for the benchmarks.
void add_yardstick_hooks(Napi::Env env, Napi::Object k);

}  // namespace ck
