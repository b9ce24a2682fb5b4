// The kernel hooks of the binding's `kernels` object: each checks its
// arguments (naming the one it rejects), then runs one kernel synchronously
// on the shared kernel pool.
#include "binding_kernels.h"

#include <napi.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "attention_simd.h"
#include "binding_args.h"
#include "cpu.h"
#include "kernels.h"
#include "quant.h"
#include "quant_dot.h"
#include "thread_pool.h"

namespace ck {

namespace {
std::unique_ptr<ThreadPool> g_kernel_pool;
}  // namespace

ThreadPool* kernel_pool() {
  if (!g_kernel_pool) g_kernel_pool = std::make_unique<ThreadPool>(default_threads());
  return g_kernel_pool.get();
}

namespace {

Napi::Value SetThreads(const Napi::CallbackInfo& info) {
  const int32_t n = info[0].As<Napi::Number>().Int32Value();
  need(info.Env(), n >= 1 && n <= 1024, "threads must be in [1, 1024]");
  g_kernel_pool = std::make_unique<ThreadPool>(n);
  return info.Env().Undefined();
}

Napi::Value GetThreads(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), kernel_pool()->threads()); }

Napi::Value SetIsaJs(const Napi::CallbackInfo& info) {
  const std::string s = info[0].As<Napi::String>().Utf8Value();
  need(info.Env(), s == "generic" || s == "avx2" || s == "avx512", "isa must be \"generic\", \"avx2\" or \"avx512\"");
  return Napi::Boolean::New(info.Env(),
                            set_isa(s == "avx512" ? Isa::Avx512 : s == "avx2" ? Isa::Avx2 : Isa::Generic));
}

Napi::Value GetIsa(const Napi::CallbackInfo& info) {
  const Isa isa = active_isa();
  return Napi::String::New(info.Env(), isa == Isa::Avx512 ? "avx512" : isa == Isa::Avx2 ? "avx2" : "generic");
}

Napi::Value GetInt8Tiles(const Napi::CallbackInfo& info) {
  const Int8Tiles t = int8_tiles();
  return Napi::String::New(info.Env(), t == Int8Tiles::Avx512Vnni ? "avx512vnni" : t == Int8Tiles::Avx2 ? "avx2" : "generic");
}

Napi::Value F32ToF16(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  Napi::Uint16Array y = u16(env, info[1], "y");
  need(env, y.ElementLength() == x.ElementLength(), "y must have x's length");
  // The vector path (the one routed append uses) over the whole array.
  routed_append(x.Data(), std::vector<int32_t>{0}.data(), 1, static_cast<int32_t>(x.ElementLength()), y.Data(), nullptr);
  return env.Undefined();
}

Napi::Value F32ToF16Scalar(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  Napi::Uint16Array y = u16(env, info[1], "y");
  need(env, y.ElementLength() == x.ElementLength(), "y must have x's length");
  for (size_t i = 0; i < x.ElementLength(); ++i) y[i] = f32_to_f16(x[i]);
  return env.Undefined();
}

Napi::Value F16ToF32(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint16Array x = u16(env, info[0], "x");
  Napi::Float32Array y = f32(env, info[1], "y");
  need(env, y.ElementLength() == x.ElementLength(), "y must have x's length");
  for (size_t i = 0; i < x.ElementLength(); ++i) y[i] = f16_to_f32(x[i]);
  return env.Undefined();
}

// attentionExp(x, y): y = e^x through the attention softmax's exp on the
// active path (its error bound is tested; defined for x <= 0).
Napi::Value AttentionExpJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  Napi::Float32Array y = f32(env, info[1], "y");
  need(env, y.ElementLength() == x.ElementLength(), "y must have x's length");
  attention_exp(x.Data(), y.Data(), static_cast<int64_t>(x.ElementLength()));
  return env.Undefined();
}

Napi::Value Bf16ToF32(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint16Array x = u16(env, info[0], "x");
  Napi::Float32Array y = f32(env, info[1], "y");
  need(env, y.ElementLength() == x.ElementLength(), "y must have x's length");
  for (size_t i = 0; i < x.ElementLength(); ++i) y[i] = bf16_to_f32(x[i]);
  return env.Undefined();
}

// routedAppend(rows: Float32Array [B*rowElems], slots: Int32Array [B], rowElems, pages: Uint16Array)
Napi::Value RoutedAppendJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array rows = f32(env, info[0], "rows");
  Napi::Int32Array slots = i32(env, info[1], "slots");
  const int32_t row_elems = info[2].As<Napi::Number>().Int32Value();
  Napi::Uint16Array pages = u16(env, info[3], "pages");
  const int64_t B = static_cast<int64_t>(slots.ElementLength());
  need(env, row_elems >= 1 && static_cast<int64_t>(rows.ElementLength()) == B * row_elems, "rows must be [B, rowElems]");
  const int64_t num_slots = static_cast<int64_t>(pages.ElementLength()) / row_elems;
  std::vector<bool> used(static_cast<size_t>(num_slots), false);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t s = slots[static_cast<size_t>(b)];
    need(env, s >= 0 && s < num_slots, "slots[" + std::to_string(b) + "] = " + std::to_string(s) + " is out of range");
    need(env, !used[static_cast<size_t>(s)], "slots[" + std::to_string(b) + "] = " + std::to_string(s) + " is a duplicate");
    used[static_cast<size_t>(s)] = true;
  }
  routed_append(rows.Data(), slots.Data(), static_cast<int32_t>(B), row_elems, pages.Data(), kernel_pool());
  return env.Undefined();
}

struct AttnDims {
  int32_t T, n_heads, n_kv, head_dim, v_head_dim;
  int32_t window;  // optional, 0: global
  float softcap;   // optional, 0: none
};

AttnDims attn_dims(Napi::Env env, const Napi::Object& o) {
  AttnDims d{get_int(env, o, "T"), get_int(env, o, "nHeads"), get_int(env, o, "nKv"), get_int(env, o, "headDim"), 0, 0, 0.0f};
  d.v_head_dim = get_int(env, o, "vHeadDim", false, d.head_dim);
  d.window = get_int(env, o, "window", false, 0);
  d.softcap = get_float(env, o, "softcap", 0.0f);
  need(env, d.T >= 0 && d.n_heads >= 1 && d.n_kv >= 1 && d.n_heads % d.n_kv == 0 && d.head_dim >= 1 && d.v_head_dim >= 1,
       "attention: bad dimensions");
  need(env, d.window >= 0, "attention: window must be >= 0 (0: global)");
  need(env, d.softcap >= 0.0f && std::isfinite(d.softcap), "attention: softcap must be >= 0 (0: none)");
  return d;
}

Napi::Value PagedAttentionJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Napi::Object o = info[0].As<Napi::Object>();
  const AttnDims d = attn_dims(env, o);
  const int32_t ps = get_int(env, o, "pageSize"), stride = get_int(env, o, "ptStride");
  Napi::Float32Array q = f32(env, o.Get("q"), "q"), out = f32(env, o.Get("out"), "out");
  Napi::Uint16Array k = u16(env, o.Get("kPages"), "kPages"), v = u16(env, o.Get("vPages"), "vPages");
  Napi::Int32Array pt = i32(env, o.Get("pageTable"), "pageTable"), seq = i32(env, o.Get("rowSeq"), "rowSeq"),
                   pos = i32(env, o.Get("rowPos"), "rowPos");
  need(env, ps >= 1 && stride >= 1 && pt.ElementLength() % static_cast<size_t>(stride) == 0, "attention: bad page table shape");
  const int64_t num_pages = static_cast<int64_t>(k.ElementLength()) / (static_cast<int64_t>(ps) * d.n_kv * d.head_dim);
  need(env, static_cast<int64_t>(v.ElementLength()) == num_pages * ps * d.n_kv * d.v_head_dim &&
                static_cast<int64_t>(k.ElementLength()) == num_pages * ps * d.n_kv * d.head_dim,
       "attention: kPages/vPages sizes disagree");
  need(env, static_cast<int64_t>(q.ElementLength()) == static_cast<int64_t>(d.T) * d.n_heads * d.head_dim, "q must be [T, nHeads, headDim]");
  need(env, static_cast<int64_t>(out.ElementLength()) == static_cast<int64_t>(d.T) * d.n_heads * d.v_head_dim, "out must be [T, nHeads, vHeadDim]");
  need(env, seq.ElementLength() == static_cast<size_t>(d.T) && pos.ElementLength() == static_cast<size_t>(d.T), "rowSeq/rowPos must have T entries");
  const int64_t S = static_cast<int64_t>(pt.ElementLength()) / stride;
  for (int32_t t = 0; t < d.T; ++t) {
    need(env, seq[t] >= 0 && seq[t] < S && pos[t] >= 0 && pos[t] / ps < stride, "row " + std::to_string(t) + ": sequence or position out of range");
    for (int32_t i = 0; i <= pos[t] / ps; ++i) {
      const int32_t p = pt[static_cast<size_t>(static_cast<int64_t>(seq[t]) * stride + i)];
      need(env, p >= 0 && p < num_pages, "row " + std::to_string(t) + ": page id out of range");
    }
  }
  PagedAttention a{q.Data(), k.Data(), v.Data(), pt.Data(), seq.Data(), pos.Data(), out.Data(),
                   d.T, d.n_heads, d.n_kv, d.head_dim, d.v_head_dim, ps, stride, num_pages,
                   o.Get("scale").As<Napi::Number>().FloatValue(), d.window, d.softcap};
  paged_attention(a, kernel_pool());
  return env.Undefined();
}

Napi::Value ContiguousAttentionJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Napi::Object o = info[0].As<Napi::Object>();
  const AttnDims d = attn_dims(env, o);
  const int32_t cap = get_int(env, o, "ctxCap");
  Napi::Float32Array q = f32(env, o.Get("q"), "q"), out = f32(env, o.Get("out"), "out");
  Napi::Uint16Array k = u16(env, o.Get("k"), "k"), v = u16(env, o.Get("v"), "v");
  Napi::Int32Array seq = i32(env, o.Get("rowSeq"), "rowSeq"), pos = i32(env, o.Get("rowPos"), "rowPos");
  need(env, cap >= 1, "ctxCap must be >= 1");
  const int64_t S = static_cast<int64_t>(k.ElementLength()) / (static_cast<int64_t>(cap) * d.n_kv * d.head_dim);
  need(env, static_cast<int64_t>(k.ElementLength()) == S * cap * d.n_kv * d.head_dim &&
                static_cast<int64_t>(v.ElementLength()) == S * cap * d.n_kv * d.v_head_dim,
       "attention: k/v sizes disagree");
  need(env, static_cast<int64_t>(q.ElementLength()) == static_cast<int64_t>(d.T) * d.n_heads * d.head_dim, "q must be [T, nHeads, headDim]");
  need(env, static_cast<int64_t>(out.ElementLength()) == static_cast<int64_t>(d.T) * d.n_heads * d.v_head_dim, "out must be [T, nHeads, vHeadDim]");
  need(env, seq.ElementLength() == static_cast<size_t>(d.T) && pos.ElementLength() == static_cast<size_t>(d.T), "rowSeq/rowPos must have T entries");
  for (int32_t t = 0; t < d.T; ++t)
    need(env, seq[t] >= 0 && seq[t] < S && pos[t] >= 0 && pos[t] < cap, "row " + std::to_string(t) + ": sequence or position out of range");
  ContiguousAttention a{q.Data(), k.Data(), v.Data(), seq.Data(), pos.Data(), out.Data(),
                        d.T, d.n_heads, d.n_kv, d.head_dim, d.v_head_dim, cap, o.Get("scale").As<Napi::Number>().FloatValue(),
                        d.window, d.softcap};
  contiguous_attention(a, kernel_pool());
  return env.Undefined();
}

// matmul(x: Float32Array [T*K], T, K, w: Uint8Array (bytes of [N, K] in dtype), dtype, N, bias: Float32Array|null, y)
Napi::Value MatmulJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  const int32_t T = info[1].As<Napi::Number>().Int32Value(), K = info[2].As<Napi::Number>().Int32Value();
  Napi::Uint8Array w = u8(env, info[3], "w");
  const DType dt = dtype_of(env, info[4], "dtype");
  const int32_t N = info[5].As<Napi::Number>().Int32Value();
  const float* bias = nullptr;
  if (!info[6].IsNull() && !info[6].IsUndefined()) {
    Napi::Float32Array b = f32(env, info[6], "bias");
    need(env, b.ElementLength() == static_cast<size_t>(N), "bias must have N entries");
    bias = b.Data();
  }
  Napi::Float32Array y = f32(env, info[7], "y");
  need(env, T >= 0 && K >= 1 && N >= 1, "matmul: bad dimensions");
  need(env, static_cast<int64_t>(x.ElementLength()) == static_cast<int64_t>(T) * K, "x must be [T, K]");
  need(env, bytes_of(dt, K) > 0 && static_cast<int64_t>(w.ByteLength()) == static_cast<int64_t>(N) * bytes_of(dt, K),
       "w must hold [N, K] in dtype (K a whole number of its blocks)");
  need(env, static_cast<int64_t>(y.ElementLength()) == static_cast<int64_t>(T) * N, "y must be [T, N]");
  need(env, is_quantized(dt) || reinterpret_cast<uintptr_t>(w.Data()) % dtype_bytes(dt) == 0,
       "w must be aligned to its dtype");
  matmul(x.Data(), T, K, w.Data(), dt, N, bias, y.Data(), kernel_pool());
  return env.Undefined();
}

// rmsnorm(x, w: Uint8Array, dtype, T, D, eps, y)
Napi::Value RmsnormJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  Napi::Uint8Array w = u8(env, info[1], "w");
  const DType dt = dtype_of(env, info[2], "dtype");
  need(env, !is_quantized(dt), "rmsnorm: w must be f32, f16 or bf16");
  const int32_t T = info[3].As<Napi::Number>().Int32Value(), D = info[4].As<Napi::Number>().Int32Value();
  const float eps = info[5].As<Napi::Number>().FloatValue();
  Napi::Float32Array y = f32(env, info[6], "y");
  need(env, T >= 0 && D >= 1 && static_cast<int64_t>(x.ElementLength()) == static_cast<int64_t>(T) * D &&
                y.ElementLength() == x.ElementLength() && static_cast<int64_t>(w.ByteLength()) == D * dtype_bytes(dt),
       "rmsnorm: x, y must be [T, D] and w [D]");
  rmsnorm(x.Data(), w.Data(), dt, T, D, eps, y.Data(), kernel_pool());
  return env.Undefined();
}

// rope(x (in place), T, nHeads, headDim, pos: Int32Array, invFreq: Float32Array)
Napi::Value RopeJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  const int32_t T = info[1].As<Napi::Number>().Int32Value(), H = info[2].As<Napi::Number>().Int32Value(),
                D = info[3].As<Napi::Number>().Int32Value();
  Napi::Int32Array pos = i32(env, info[4], "pos");
  Napi::Float32Array inv = f32(env, info[5], "invFreq");
  need(env, T >= 0 && H >= 1 && D >= 2 && D % 2 == 0 && static_cast<int64_t>(x.ElementLength()) == static_cast<int64_t>(T) * H * D &&
                pos.ElementLength() == static_cast<size_t>(T) && inv.ElementLength() == static_cast<size_t>(D / 2),
       "rope: x must be [T, nHeads, headDim], pos [T], invFreq [headDim/2]");
  rope(x.Data(), T, H, D, pos.Data(), inv.Data(), kernel_pool());
  return env.Undefined();
}

Napi::Value SwigluJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array g = f32(env, info[0], "gate"), u = f32(env, info[1], "up"), out = f32(env, info[2], "out");
  need(env, g.ElementLength() == u.ElementLength() && out.ElementLength() == g.ElementLength(), "swiglu: shapes disagree");
  swiglu(g.Data(), u.Data(), 1, static_cast<int32_t>(g.ElementLength()), out.Data(), kernel_pool());
  return env.Undefined();
}

Napi::Value GegluJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array g = f32(env, info[0], "gate"), u = f32(env, info[1], "up"), out = f32(env, info[2], "out");
  need(env, g.ElementLength() == u.ElementLength() && out.ElementLength() == g.ElementLength(), "geglu: shapes disagree");
  geglu(g.Data(), u.Data(), 1, static_cast<int32_t>(g.ElementLength()), out.Data(), kernel_pool());
  return env.Undefined();
}

// softcap(x (in place), cap): x = cap * tanh(x / cap)
Napi::Value SoftcapJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array x = f32(env, info[0], "x");
  need(env, info[1].IsNumber(), "softcap: cap must be a number");
  const float cap = info[1].As<Napi::Number>().FloatValue();
  need(env, cap > 0.0f && std::isfinite(cap), "softcap: cap must be > 0");
  softcap(x.Data(), static_cast<int64_t>(x.ElementLength()), cap, kernel_pool());
  return env.Undefined();
}

// embed(ids: Int32Array, table: Uint8Array [vocab, D] in dtype, dtype, D, out)
Napi::Value EmbedJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Int32Array ids = i32(env, info[0], "ids");
  Napi::Uint8Array table = u8(env, info[1], "table");
  const DType dt = dtype_of(env, info[2], "dtype");
  const int32_t D = info[3].As<Napi::Number>().Int32Value();
  Napi::Float32Array out = f32(env, info[4], "out");
  need(env, D >= 1 && bytes_of(dt, D) > 0 && table.ByteLength() % static_cast<size_t>(bytes_of(dt, D)) == 0,
       "embed: table must be [vocab, D]");
  const int64_t vocab = static_cast<int64_t>(table.ByteLength()) / bytes_of(dt, D);
  need(env, out.ElementLength() == ids.ElementLength() * static_cast<size_t>(D), "embed: out must be [T, D]");
  for (size_t i = 0; i < ids.ElementLength(); ++i)
    need(env, ids[i] >= 0 && ids[i] < vocab, "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is outside the vocabulary");
  embed(ids.Data(), static_cast<int32_t>(ids.ElementLength()), table.Data(), dt, D, out.Data(), kernel_pool());
  return env.Undefined();
}

// dequantize(src: Uint8Array, dtype, out: Float32Array): out = the exact
// values of src's out.length elements (a whole number of dtype's blocks), on
// the active ISA's path.
Napi::Value DequantizeJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array src = u8(env, info[0], "src");
  const DType dt = dtype_of(env, info[1], "dtype");
  Napi::Float32Array out = f32(env, info[2], "out");
  const int64_t n = static_cast<int64_t>(out.ElementLength());
  need(env, bytes_of(dt, n) >= 0 && static_cast<int64_t>(src.ByteLength()) == bytes_of(dt, n),
       "dequantize: src must hold out.length elements of dtype (a whole number of its blocks)");
#ifdef CK_HAVE_AVX2_PATH
  if (active_isa() != Isa::Generic) {
    avx2::dequantize(dt, src.Data(), n, out.Data());
    return env.Undefined();
  }
#endif
  dequantize(dt, src.Data(), n, out.Data());
  return env.Undefined();
}

}  // namespace

void add_kernel_hooks(Napi::Env env, Napi::Object k) {
  k.Set("setThreads", Napi::Function::New(env, SetThreads));
  k.Set("threads", Napi::Function::New(env, GetThreads));
  k.Set("setIsa", Napi::Function::New(env, SetIsaJs));
  k.Set("isa", Napi::Function::New(env, GetIsa));
  k.Set("int8Tiles", Napi::Function::New(env, GetInt8Tiles));
  k.Set("f32ToF16", Napi::Function::New(env, F32ToF16));
  k.Set("f32ToF16Scalar", Napi::Function::New(env, F32ToF16Scalar));
  k.Set("f16ToF32", Napi::Function::New(env, F16ToF32));
  k.Set("bf16ToF32", Napi::Function::New(env, Bf16ToF32));
  k.Set("routedAppend", Napi::Function::New(env, RoutedAppendJs));
  k.Set("pagedAttention", Napi::Function::New(env, PagedAttentionJs));
  k.Set("contiguousAttention", Napi::Function::New(env, ContiguousAttentionJs));
  k.Set("attentionExp", Napi::Function::New(env, AttentionExpJs));
  k.Set("matmul", Napi::Function::New(env, MatmulJs));
  k.Set("rmsnorm", Napi::Function::New(env, RmsnormJs));
  k.Set("rope", Napi::Function::New(env, RopeJs));
  k.Set("swiglu", Napi::Function::New(env, SwigluJs));
  k.Set("geglu", Napi::Function::New(env, GegluJs));
  k.Set("softcap", Napi::Function::New(env, SoftcapJs));
  k.Set("embed", Napi::Function::New(env, EmbedJs));
  k.Set("dequantize", Napi::Function::New(env, DequantizeJs));
}

}  // namespace ck
