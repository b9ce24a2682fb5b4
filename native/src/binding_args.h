// Argument readers shared by the N-API binding's files: each throws a JS
// TypeError or RangeError naming the argument it rejects, so bad input never
// reaches a kernel or the engine.
#pragma once

#include <napi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace ck {

// The kernel pool's and an engine's thread count when none is given: every core.
int32_t default_threads();

int32_t get_int(Napi::Env env, const Napi::Object& o, const char* key, bool required = true, int32_t fallback = 0);
bool get_bool(Napi::Env env, const Napi::Object& o, const char* key);
// A number read as f32; `fallback` when absent or null.
float get_float(Napi::Env env, const Napi::Object& o, const char* key, float fallback);

template <typename A>
A typed(Napi::Env env, Napi::Value v, const std::string& name, napi_typedarray_type type, const char* type_name) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    throw Napi::TypeError::New(env, name + " must be " + type_name);
  return v.As<A>();
}

Napi::Int32Array i32(Napi::Env env, Napi::Value v, const std::string& name);
Napi::Float32Array f32(Napi::Env env, Napi::Value v, const std::string& name);
Napi::Uint16Array u16(Napi::Env env, Napi::Value v, const std::string& name);
Napi::Uint8Array u8(Napi::Env env, Napi::Value v, const std::string& name);
// o[key] as an Int32Array, copied; errors name it "batch.<key>".
std::vector<int32_t> i32_vec(Napi::Env env, const Napi::Object& o, const char* key);
DType dtype_of(Napi::Env env, Napi::Value v, const std::string& name);
// Throws a RangeError with `message` unless ok.
void need(Napi::Env env, bool ok, const std::string& message);

}  // namespace ck
