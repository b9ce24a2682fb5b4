// The yardsticks of the binding's `kernels` object: what the benchmarks
// divide kernel times by (memory bandwidth, FMA peak), and f16 memory
// allocated the way the engine allocates its pools.
#include <napi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "binding_args.h"
#include "binding_kernels.h"
#include "engine.h"
#include "fma_peak.h"
#include "thread_pool.h"

namespace ck {
namespace {

// memread(src: Uint8Array): number — a multi-threaded streaming read of src
// on the kernel pool (a sum of its 64-bit words, returned folded to 32 bits so
// the reads cannot be optimised away): the read-only bandwidth yardstick.
Napi::Value MemreadJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array src = u8(env, info[0], "src");
  need(env, src.ByteLength() % 8 == 0, "memread: length must be a multiple of 8 bytes");
  const int64_t words = static_cast<int64_t>(src.ByteLength() / 8);
  constexpr int64_t kChunk = 1 << 17;  // words: 1 MiB
  const int64_t chunks = (words + kChunk - 1) / kChunk;
  std::vector<uint64_t> sums(static_cast<size_t>(chunks), 0);
  const uint8_t* base = src.Data();
  parallel_for(kernel_pool(), chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * kChunk, e = std::min(words, b + kChunk);
      uint64_t s = 0;
      for (int64_t i = b; i < e; ++i) {
        uint64_t w;
        std::memcpy(&w, base + i * 8, 8);
        s += w;
      }
      sums[static_cast<size_t>(c)] = s;
    }
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return Napi::Number::New(env, static_cast<double>(static_cast<uint32_t>(total ^ (total >> 32))));
}

// fmaPeak(iters): the FLOPs of `iters` rounds of independent register-only
// FMA chains on every kernel-pool thread at the active ISA's width (time it
// from JS: the FMA-peak yardstick of bench kernels).
Napi::Value FmaPeakJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int64_t iters = info[0].As<Napi::Number>().Int64Value();
  need(env, iters >= 1 && iters <= (int64_t{1} << 40), "fmaPeak: iters must be in [1, 2^40]");
  return Napi::Number::New(env, fma_peak_flops(iters, kernel_pool()));
}

// memcpy(dst: Uint8Array, src: Uint8Array): a multi-threaded copy on the
// kernel pool, the bandwidth yardstick for the attention benchmark.
Napi::Value MemcpyJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array dst = u8(env, info[0], "dst"), src = u8(env, info[1], "src");
  need(env, dst.ByteLength() == src.ByteLength(), "memcpy: dst and src lengths differ");
  const int64_t n = static_cast<int64_t>(src.ByteLength());
  constexpr int64_t kChunk = 1 << 20;
  uint8_t* d = dst.Data();
  const uint8_t* s = src.Data();
  parallel_for(kernel_pool(), (n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    const int64_t b = c0 * kChunk, e = std::min(n, c1 * kChunk);
    std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
  });
  return env.Undefined();
}

// poolF16(elems): Uint16Array — zeroed f16 memory allocated the way the CPU
// engine allocates its page pools and contiguous caches (F16Buffer::zeroed:
// advised for 2 MiB pages before the first touch), freed when the array is
// collected. Benchmarks time the attention hooks over it so they measure the
// engine's kernels on the engine's memory: a V8 array gets 4 KiB pages, and
// paged attention's jump to a random page every page_size keys then costs a
// page walk that the engine never pays.
Napi::Value PoolF16Js(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  need(env, info[0].IsNumber(), "poolF16: elems must be a number");
  const double elems = info[0].As<Napi::Number>().DoubleValue();
  need(env, elems >= 1 && elems <= 0x1p40 && elems == static_cast<double>(static_cast<int64_t>(elems)),
       "poolF16: elems must be an integer in [1, 2^40]");
  F16Buffer b = F16Buffer::zeroed(static_cast<int64_t>(elems));
  need(env, b.ptr != nullptr, "poolF16: out of memory for " + std::to_string(static_cast<int64_t>(elems)) + " f16");
  const size_t bytes = static_cast<size_t>(b.elems) * sizeof(f16);
  Napi::ArrayBuffer ab =
      Napi::ArrayBuffer::New(env, b.ptr.release(), bytes, [](Napi::Env, void* p) { std::free(p); });
  return Napi::Uint16Array::New(env, static_cast<size_t>(b.elems), ab, 0);
}

}  // namespace

void add_yardstick_hooks(Napi::Env env, Napi::Object k) {
  k.Set("memcpy", Napi::Function::New(env, MemcpyJs));
  k.Set("memread", Napi::Function::New(env, MemreadJs));
  k.Set("fmaPeak", Napi::Function::New(env, FmaPeakJs));
  k.Set("poolF16", Napi::Function::New(env, PoolF16Js));
}

}  // namespace ck
