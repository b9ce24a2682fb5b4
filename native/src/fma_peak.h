// The machine's FMA peak, measured: a register-only loop of independent FMA
// chains on every thread of the pool, at the active ISA's vector width (the
// width the GEMM runs at), so a GEMM rate can be read as a share of what the
// cores can do (bench kernels).
#pragma once

#include <cstdint>

#include "thread_pool.h"

namespace ck {
// Runs `iters` rounds of kFmaChains FMAs per thread on every pool thread;
// returns the floating-point operations done (2 per lane per FMA).
double fma_peak_flops(int64_t iters, ThreadPool* pool);
}  // namespace ck
