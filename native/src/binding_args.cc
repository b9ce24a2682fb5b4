// The binding's argument readers: each names the argument it rejects.
#include "binding_args.h"

#include <napi.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace ck {

int32_t default_threads() { return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())); }

int32_t get_int(Napi::Env env, const Napi::Object& o, const char* key, bool required, int32_t fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined() && !required) return fallback;
  if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string(key) + " must be a number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (d != static_cast<double>(static_cast<int32_t>(d)))
    throw Napi::TypeError::New(env, std::string(key) + " must be a 32-bit integer, got " + std::to_string(d));
  return static_cast<int32_t>(d);
}

bool get_bool(Napi::Env env, const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return false;
  if (!v.IsBoolean()) throw Napi::TypeError::New(env, std::string(key) + " must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

float get_float(Napi::Env env, const Napi::Object& o, const char* key, float fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined() || v.IsNull()) return fallback;
  if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string(key) + " must be a number");
  return v.As<Napi::Number>().FloatValue();
}

Napi::Int32Array i32(Napi::Env env, Napi::Value v, const std::string& name) {
  return typed<Napi::Int32Array>(env, v, name, napi_int32_array, "an Int32Array");
}
Napi::Float32Array f32(Napi::Env env, Napi::Value v, const std::string& name) {
  return typed<Napi::Float32Array>(env, v, name, napi_float32_array, "a Float32Array");
}
Napi::Uint16Array u16(Napi::Env env, Napi::Value v, const std::string& name) {
  return typed<Napi::Uint16Array>(env, v, name, napi_uint16_array, "a Uint16Array");
}
Napi::Uint8Array u8(Napi::Env env, Napi::Value v, const std::string& name) {
  return typed<Napi::Uint8Array>(env, v, name, napi_uint8_array, "a Uint8Array");
}

std::vector<int32_t> i32_vec(Napi::Env env, const Napi::Object& o, const char* key) {
  Napi::Int32Array a = i32(env, o.Get(key), std::string("batch.") + key);
  return std::vector<int32_t>(a.Data(), a.Data() + a.ElementLength());
}

constexpr const char* kDtypeNames = "\"f32\", \"f16\", \"bf16\", \"q8_0\", \"q4_0\", \"q4_k\" or \"q6_k\"";

DType dtype_of(Napi::Env env, Napi::Value v, const std::string& name) {
  if (!v.IsString()) throw Napi::TypeError::New(env, name + " must be " + kDtypeNames);
  const std::string s = v.As<Napi::String>().Utf8Value();
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  if (s == "q4_k") return DType::Q4_K;
  if (s == "q6_k") return DType::Q6_K;
  throw Napi::TypeError::New(env, name + " must be " + kDtypeNames + ", got \"" + s + "\"");
}

void need(Napi::Env env, bool ok, const std::string& message) {
  if (!ok) throw Napi::RangeError::New(env, message);
}

}  // namespace ck
