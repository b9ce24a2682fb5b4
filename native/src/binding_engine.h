// The binding's `Engine` class (native/index.ts: NativeEngine is its typed face).
#pragma once

#include <napi.h>

namespace ck {

// The constructor: new Engine(spec, invFreq: Float32Array, threads, backend: "cpu" | "cuda").
Napi::Function engine_class(Napi::Env env);

}  // namespace ck
