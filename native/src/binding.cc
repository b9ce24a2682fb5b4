// The N-API module: its exports object and the module-level functions.
// `Engine` (binding_engine.cc: weights, page pools, step, transfers, every
// real-work call off the JS thread, returning a promise) and `kernels`
// (binding_kernels.cc, binding_yardsticks.cc: synchronous single-kernel hooks
// for tests and benchmarks, on a shared thread pool) live in their own files.
// native/index.ts is the typed face of this module.
#include <napi.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend.h"
#include "binding_args.h"
#include "binding_engine.h"
#include "binding_kernels.h"
#include "cpu.h"
#include "file_lock.h"
#include "logprobs.h"

namespace ck {
namespace {

// rowLogprobs(row: Float32Array, token, top: Int32Array, out: Float64Array(3)):
// top <- the top.length most likely ids; out <- [max, sum_exp, rank]
// (logprobs.h). Synchronous on the caller's thread: one row is microseconds.
Napi::Value RowLogprobsJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array row = f32(env, info[0], "row");
  need(env, info[1].IsNumber(), "rowLogprobs: token must be a number");
  const double token = info[1].As<Napi::Number>().DoubleValue();
  Napi::Int32Array top = i32(env, info[2], "top");
  Napi::Float64Array out = typed<Napi::Float64Array>(env, info[3], "out", napi_float64_array, "a Float64Array");
  const size_t n = row.ElementLength();
  need(env, n >= 1 && n <= static_cast<size_t>(INT32_MAX), "rowLogprobs: row must hold 1 to 2^31 - 1 logits");
  need(env, token >= 0 && token < static_cast<double>(n) && std::floor(token) == token,
       "rowLogprobs: token must be an id of the row");
  need(env, top.ElementLength() <= n, "rowLogprobs: top must not be longer than the row");
  need(env, out.ElementLength() == 3, "rowLogprobs: out must hold 3 numbers");
  const RowLogprobs r = row_logprobs(row.Data(), static_cast<int32_t>(n), static_cast<int32_t>(token),
                                     static_cast<int32_t>(top.ElementLength()), top.Data());
  out[0] = r.max;
  out[1] = r.sum_exp;
  out[2] = r.rank;
  return env.Undefined();
}

// cudaProbe() -> {built, devices, reason, arch, toolkit, numerics}: whether
// this addon carries the CUDA backend, how many devices the runtime sees (or
// why none), and what a CUDA engine's numerics depend on (backend.h).
Napi::Value CudaProbeJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe p = cuda_probe();
  Napi::Object o = Napi::Object::New(env);
  o.Set("built", p.built);
  o.Set("devices", p.devices);
  if (!p.reason.empty()) o.Set("reason", p.reason);
  if (!p.arch.empty()) o.Set("arch", p.arch);
  if (!p.toolkit.empty()) o.Set("toolkit", p.toolkit);
  if (!p.numerics.empty()) o.Set("numerics", p.numerics);
  return o;
}

// cudaCopyGbPerS(bytes) -> GB/s (read + written) of a device-to-device copy
// (backend.h cuda_copy_gb_per_s); blocks the calling thread ~13 copies long.
Napi::Value CudaCopyGbPerSJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  need(env, info[0].IsNumber(), "cudaCopyGbPerS: bytes must be a number");
  const double bytes = info[0].As<Napi::Number>().DoubleValue();
  need(env, bytes >= (1 << 20) && bytes <= 0x1p36 && bytes == static_cast<double>(static_cast<int64_t>(bytes)),
       "cudaCopyGbPerS: bytes must be an integer in [2^20, 2^36]");
  try {
    return Napi::Number::New(env, cuda_copy_gb_per_s(static_cast<size_t>(bytes)));
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

Napi::Object Features(Napi::Env env) {
  const CpuFeatures f = cpu_features();
  Napi::Object o = Napi::Object::New(env);
  o.Set("avx2", f.avx2);
  o.Set("fma", f.fma);
  o.Set("f16c", f.f16c);
  o.Set("avx512", f.avx512);
  o.Set("vnni", f.vnni);
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Engine", engine_class(env));
  exports.Set("cudaProbe", Napi::Function::New(env, CudaProbeJs));
  exports.Set("cudaCopyGbPerS", Napi::Function::New(env, CudaCopyGbPerSJs));
  exports.Set("features", Features(env));
  exports.Set("defaultThreads", Napi::Number::New(env, default_threads()));
  exports.Set("lockFileExclusive", Napi::Function::New(env, LockFileExclusiveJs));
  exports.Set("rowLogprobs", Napi::Function::New(env, RowLogprobsJs));
  Napi::Object k = Napi::Object::New(env);
  add_kernel_hooks(env, k);
  add_yardstick_hooks(env, k);
  exports.Set("kernels", k);
  return exports;
}

}  // namespace
}  // namespace ck

static Napi::Object InitModule(Napi::Env env, Napi::Object exports) { return ck::Init(env, exports); }

NODE_API_MODULE(continuum_native, InitModule)
