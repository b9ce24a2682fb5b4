// The N-API binding: `Engine` (weights, page pools, step, transfers; every
// real-work call off the JS thread, returning a promise) and `kernels`
// (synchronous single-kernel hooks for tests and benchmarks, on a shared
// thread pool). native/index.ts is the typed face of this module.
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "async_queue.h"
#include "attention_simd.h"
#include "backend.h"
#include "cpu.h"
#include "engine.h"
#include "file_lock.h"
#include "fma_peak.h"
#include "kernels.h"
#include "logprobs.h"
#include "quant.h"
#include "thread_pool.h"

namespace ck {
namespace {

constexpr size_t kQueueCapacity = 1024;

int32_t default_threads() { return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())); }

// ---- argument readers (each names the argument it rejects) ------------------

int32_t get_int(Napi::Env env, const Napi::Object& o, const char* key, bool required = true, int32_t fallback = 0) {
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

// A number read as f32; `fallback` when absent or null.
float get_float(Napi::Env env, const Napi::Object& o, const char* key, float fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined() || v.IsNull()) return fallback;
  if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string(key) + " must be a number");
  return v.As<Napi::Number>().FloatValue();
}

template <typename A>
A typed(Napi::Env env, Napi::Value v, const std::string& name, napi_typedarray_type type, const char* type_name) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    throw Napi::TypeError::New(env, name + " must be " + type_name);
  return v.As<A>();
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

// ---- engine jobs -------------------------------------------------------------

struct LoadJob : Job {
  struct Item {
    DType dtype;
    const uint8_t* data;
    size_t bytes;
  };
  Backend* engine;
  std::vector<Item> items;
  LoadJob(Napi::Env env, Backend* e) : Job(env), engine(e) {}
  void execute() override {
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string err = engine->set_weight(i, items[i].dtype, items[i].data, items[i].bytes);
      if (!err.empty()) throw std::runtime_error(err);
    }
  }
};

struct StepJob : Job {
  Backend* engine;
  StepBatch batch;
  bool paged;
  Napi::Reference<Napi::Float32Array> out;
  float* logits;
  StepJob(Napi::Env env, Backend* e, StepBatch b, bool p)
      : Job(env), engine(e), batch(std::move(b)), paged(p) {
    Napi::Float32Array a = Napi::Float32Array::New(env, batch.logit_rows.size() * static_cast<size_t>(engine->spec().vocab));
    logits = a.Data();
    out = Napi::Persistent(a);
  }
  void execute() override {
    if (paged) {
      engine->step(batch, logits);
    } else {
      engine->step_contiguous(batch, logits);
    }
  }
  Napi::Value result(Napi::Env) override { return out.Value(); }
};

struct DownloadJob : Job {
  Backend* engine;
  std::vector<int32_t> ids;
  Napi::Reference<Napi::Uint8Array> out;
  uint8_t* bytes;
  DownloadJob(Napi::Env env, Backend* e, std::vector<int32_t> i) : Job(env), engine(e), ids(std::move(i)) {
    Napi::Uint8Array a = Napi::Uint8Array::New(env, ids.size() * static_cast<size_t>(engine->page_bytes()));
    bytes = a.Data();
    out = Napi::Persistent(a);
  }
  void execute() override { engine->download_pages(ids, bytes); }
  Napi::Value result(Napi::Env) override { return out.Value(); }
};

struct UploadJob : Job {
  Backend* engine;
  std::vector<int32_t> ids;
  const uint8_t* bytes;
  UploadJob(Napi::Env env, Backend* e, std::vector<int32_t> i, const uint8_t* b)
      : Job(env), engine(e), ids(std::move(i)), bytes(b) {}
  void execute() override { engine->upload_pages(ids, bytes); }
};

struct CopyJob : Job {
  Backend* engine;
  int32_t src, dst;
  CopyJob(Napi::Env env, Backend* e, int32_t s, int32_t d) : Job(env), engine(e), src(s), dst(d) {}
  void execute() override { engine->copy_page(src, dst); }
};

// ---- Engine ------------------------------------------------------------------

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "Engine",
                       {
                           InstanceMethod<&EngineWrap::LoadWeights>("loadWeights"),
                           InstanceMethod<&EngineWrap::TensorNames>("tensorNames"),
                           InstanceMethod<&EngineWrap::CreatePool>("createPool"),
                           InstanceMethod<&EngineWrap::CreateContiguousCache>("createContiguousCache"),
                           InstanceMethod<&EngineWrap::Step>("step"),
                           InstanceMethod<&EngineWrap::StepContiguous>("stepContiguous"),
                           InstanceMethod<&EngineWrap::DownloadPages>("downloadPages"),
                           InstanceMethod<&EngineWrap::UploadPages>("uploadPages"),
                           InstanceMethod<&EngineWrap::CopyPage>("copyPage"),
                           InstanceMethod<&EngineWrap::Free>("free"),
                           InstanceMethod<&EngineWrap::SetProfiling>("setProfiling"),
                           InstanceMethod<&EngineWrap::Profile>("profile"),
                           InstanceAccessor<&EngineWrap::Threads>("threads"),
                           InstanceAccessor<&EngineWrap::PageBytes>("pageBytes"),
                           InstanceAccessor<&EngineWrap::BackendName>("backend"),
                       });
  }

  // new Engine(spec, invFreq: Float32Array, threads, backend: "cpu" | "cuda")
  explicit EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject()) throw Napi::TypeError::New(env, "spec must be an object");
    const Napi::Object s = info[0].As<Napi::Object>();
    ModelSpec m;
    m.n_layers = get_int(env, s, "nLayers");
    m.hidden = get_int(env, s, "hidden");
    m.n_heads = get_int(env, s, "nHeads");
    m.n_kv = get_int(env, s, "nKvHeads");
    m.head_dim = get_int(env, s, "headDim");
    m.v_head_dim = get_int(env, s, "vHeadDim", false, m.head_dim);
    m.ffn = get_int(env, s, "ffn");
    m.vocab = get_int(env, s, "vocab");
    m.max_position = get_int(env, s, "maxPosition");
    m.rms_eps = s.Get("rmsEps").As<Napi::Number>().FloatValue();
    m.attention_bias = s.Get("attentionBias").ToBoolean().Value();
    m.tied_embeddings = s.Get("tiedEmbeddings").ToBoolean().Value();
    // The family fields (backend.h: ModelSpec); absent = the Llama forward.
    m.norm_offset = get_bool(env, s, "normOffset");
    m.qk_norm = get_bool(env, s, "qkNorm");
    m.sandwich_norms = get_bool(env, s, "sandwichNorms");
    const Napi::Value act = s.Get("activation");
    if (!act.IsUndefined()) {
      const std::string a = act.IsString() ? act.As<Napi::String>().Utf8Value() : "";
      if (a == "silu") m.activation = Activation::Silu;
      else if (a == "gelu_tanh") m.activation = Activation::GeluTanh;
      else throw Napi::TypeError::New(env, "spec.activation must be \"silu\" or \"gelu_tanh\"");
    }
    m.embed_scale = get_float(env, s, "embedScale", 1.0f);
    m.rope_scale = get_float(env, s, "ropeScale", 1.0f);
    m.attn_scale = get_float(env, s, "attnScale", 0.0f);
    m.attn_softcap = get_float(env, s, "attnSoftcap", 0.0f);
    m.final_softcap = get_float(env, s, "finalSoftcap", 0.0f);
    const Napi::Value windows = s.Get("layerWindows");
    if (!windows.IsUndefined() && !windows.IsNull()) {
      Napi::Int32Array w = i32(env, windows, "spec.layerWindows");
      m.window.assign(w.Data(), w.Data() + w.ElementLength());
    }
    const std::string spec_err = validate_spec(m);
    need(env, spec_err.empty(), spec_err);
    Napi::Float32Array inv = f32(env, info[1], "invFreq");
    std::vector<float> inv_freq(inv.Data(), inv.Data() + inv.ElementLength());
    try {
      inv_freq = per_layer_inv_freq(m, std::move(inv_freq));
    } catch (const std::exception& e) {
      throw Napi::RangeError::New(env, e.what());
    }
    const int32_t threads = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : default_threads();
    need(env, threads >= 1 && threads <= 1024, "threads must be in [1, 1024]");
    const std::string backend = info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "cpu";
    if (backend == "cpu") {
      engine_ = std::make_unique<Engine>(m, std::move(inv_freq), threads);
    } else if (backend == "cuda") {
      try {
        engine_ = make_cuda_engine(m, std::move(inv_freq));
      } catch (const std::exception& e) {
        throw Napi::Error::New(env, e.what());
      }
    } else {
      throw Napi::TypeError::New(env, "backend must be \"cpu\" or \"cuda\", got \"" + backend + "\"");
    }
    compute_ = std::make_unique<AsyncQueue>(env, "continuum-compute", kQueueCapacity, /*background=*/true);
    transfer_ = std::make_unique<AsyncQueue>(env, "continuum-transfer", kQueueCapacity, /*background=*/false);
  }

  ~EngineWrap() override { release(); }

 private:
  void release() {
    if (compute_) compute_->close_and_join();
    if (transfer_) transfer_->close_and_join();
    engine_.reset();
  }

  Backend* live(Napi::Env env) {
    if (!engine_) throw Napi::Error::New(env, "engine freed");
    return engine_.get();
  }

  Napi::Value TensorNames(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const std::vector<TensorSlot> slots = live(env)->tensor_slots();
    Napi::Array out = Napi::Array::New(env, slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", slots[i].name);
      Napi::Array shape = Napi::Array::New(env, slots[i].shape.size());
      for (size_t d = 0; d < slots[i].shape.size(); ++d) shape.Set(d, Napi::Number::New(env, static_cast<double>(slots[i].shape[d])));
      o.Set("shape", shape);
      out.Set(i, o);
    }
    return out;
  }

  // loadWeights([{dtype, data: Uint8Array}] in tensorNames() order) -> Promise<void>
  Napi::Value LoadWeights(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "weights must be an array");
    Napi::Array arr = info[0].As<Napi::Array>();
    const std::vector<TensorSlot> slots = e->tensor_slots();
    need(env, arr.Length() == slots.size(),
         "weights: " + std::to_string(arr.Length()) + " tensors, the model has " + std::to_string(slots.size()));
    auto* job = new LoadJob(env, e);
    try {
      for (uint32_t i = 0; i < arr.Length(); ++i) {
        Napi::Object t = arr.Get(i).As<Napi::Object>();
        const DType dt = dtype_of(env, t.Get("dtype"), slots[i].name + ".dtype");
        Napi::Uint8Array d = u8(env, t.Get("data"), slots[i].name + ".data");
        job->items.push_back({dt, d.Data(), d.ByteLength()});
        job->keep(d);
      }
      job->keep(Value());
    } catch (...) {
      delete job;
      throw;
    }
    return compute_->submit(env, job);
  }

  Napi::Value CreatePool(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    // Optional third argument: the layer group of each layer (Int32Array [nLayers]).
    std::vector<int32_t> groups;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      need(env, info[2].IsTypedArray() && info[2].As<Napi::TypedArray>().TypedArrayType() == napi_int32_array,
           "createPool: layerGroups must be an Int32Array");
      const Napi::Int32Array a = info[2].As<Napi::Int32Array>();
      groups.assign(a.Data(), a.Data() + a.ElementLength());
    }
    const std::string err = e->create_pool(info[0].As<Napi::Number>().Int64Value(), info[1].As<Napi::Number>().Int32Value(), groups);
    need(env, err.empty(), err);
    return env.Undefined();
  }

  Napi::Value CreateContiguousCache(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    const std::string err = e->create_contiguous(info[0].As<Napi::Number>().Int32Value(), info[1].As<Napi::Number>().Int32Value());
    need(env, err.empty(), err);
    return env.Undefined();
  }

  StepBatch read_batch(Napi::Env env, Napi::Value v, bool paged) {
    if (!v.IsObject()) throw Napi::TypeError::New(env, "batch must be an object");
    const Napi::Object o = v.As<Napi::Object>();
    StepBatch b;
    b.tokens = i32_vec(env, o, "tokens");
    b.positions = i32_vec(env, o, "positions");
    b.row_seq = i32_vec(env, o, "rowSeq");
    b.logit_rows = i32_vec(env, o, "logitRows");
    if (paged) {
      b.slots = i32_vec(env, o, "slotMapping");
      b.page_table = i32_vec(env, o, "pageTable");
      b.pt_stride = get_int(env, o, "ptStride");
    }
    return b;
  }

  Napi::Value submit_step(const Napi::CallbackInfo& info, bool paged) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    StepBatch b = read_batch(env, info[0], paged);
    const std::string err = paged ? e->validate_paged(b) : e->validate_contiguous(b);
    need(env, err.empty(), err);
    auto* job = new StepJob(env, e, std::move(b), paged);
    job->keep(Value());
    return compute_->submit(env, job);
  }

  Napi::Value Step(const Napi::CallbackInfo& info) { return submit_step(info, true); }
  Napi::Value StepContiguous(const Napi::CallbackInfo& info) { return submit_step(info, false); }

  std::vector<int32_t> page_ids(Napi::Env env, Napi::Value v, Backend* e) {
    Napi::Int32Array a = i32(env, v, "pageIds");
    std::vector<int32_t> ids(a.Data(), a.Data() + a.ElementLength());
    const std::string err = e->validate_pages(ids);
    need(env, err.empty(), err);
    return ids;
  }

  Napi::Value DownloadPages(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    auto* job = new DownloadJob(env, e, page_ids(env, info[0], e));
    job->keep(Value());
    return transfer_->submit(env, job);
  }

  Napi::Value UploadPages(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    std::vector<int32_t> ids = page_ids(env, info[0], e);
    Napi::Uint8Array bytes = u8(env, info[1], "bytes");
    const size_t want = ids.size() * static_cast<size_t>(e->page_bytes());
    need(env, bytes.ByteLength() == want,
         "uploadPages: bytes has " + std::to_string(bytes.ByteLength()) + " bytes, " + std::to_string(ids.size()) +
             " pages need " + std::to_string(want));
    auto* job = new UploadJob(env, e, std::move(ids), bytes.Data());
    job->keep(bytes);
    job->keep(Value());
    return transfer_->submit(env, job);
  }

  Napi::Value CopyPage(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    if (!info[0].IsNumber() || !info[1].IsNumber()) throw Napi::TypeError::New(env, "copyPage(src, dst) takes two page ids");
    const int32_t src = info[0].As<Napi::Number>().Int32Value();
    const int32_t dst = info[1].As<Napi::Number>().Int32Value();
    const std::string err = e->validate_pages({src, dst});
    need(env, err.empty(), src == dst ? "copyPage: source and destination are the same page " + std::to_string(src) : err);
    auto* job = new CopyJob(env, e, src, dst);
    job->keep(Value());
    return transfer_->submit(env, job);
  }

  Napi::Value Free(const Napi::CallbackInfo& info) {
    release();
    return info.Env().Undefined();
  }

  Napi::Value Threads(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), live(info.Env())->threads()); }
  Napi::Value BackendName(const Napi::CallbackInfo& info) {
    return Napi::String::New(info.Env(), live(info.Env())->name());
  }
  Napi::Value PageBytes(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(live(info.Env())->page_bytes()));
  }

  // setProfiling(on: boolean): times later steps by part (backend.h
  // StepProfile); throws where the backend does not.
  void SetProfiling(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    need(env, info[0].IsBoolean(), "setProfiling: on must be a boolean");
    const std::string err = live(env)->set_profiling(info[0].As<Napi::Boolean>().Value());
    if (!err.empty()) throw Napi::Error::New(env, err);
  }

  // profile() -> {steps, stepMs, gemmMs, attentionMs} since profiling was enabled.
  Napi::Value Profile(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const StepProfile p = live(env)->profile();
    Napi::Object o = Napi::Object::New(env);
    o.Set("steps", static_cast<double>(p.steps));
    o.Set("stepMs", p.step_ms);
    o.Set("gemmMs", p.gemm_ms);
    o.Set("attentionMs", p.attention_ms);
    return o;
  }

  std::unique_ptr<Backend> engine_;
  std::unique_ptr<AsyncQueue> compute_, transfer_;
};

// ---- kernels (synchronous hooks) ------------------------------------------------

std::unique_ptr<ThreadPool> g_kernel_pool;

ThreadPool* kernel_pool() {
  if (!g_kernel_pool) g_kernel_pool = std::make_unique<ThreadPool>(default_threads());
  return g_kernel_pool.get();
}

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
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Engine", EngineWrap::Init(env));
  exports.Set("cudaProbe", Napi::Function::New(env, CudaProbeJs));
  exports.Set("cudaCopyGbPerS", Napi::Function::New(env, CudaCopyGbPerSJs));
  exports.Set("features", Features(env));
  exports.Set("defaultThreads", Napi::Number::New(env, default_threads()));
  exports.Set("lockFileExclusive", Napi::Function::New(env, LockFileExclusiveJs));
  exports.Set("rowLogprobs", Napi::Function::New(env, RowLogprobsJs));
  Napi::Object k = Napi::Object::New(env);
  k.Set("setThreads", Napi::Function::New(env, SetThreads));
  k.Set("threads", Napi::Function::New(env, GetThreads));
  k.Set("setIsa", Napi::Function::New(env, SetIsaJs));
  k.Set("isa", Napi::Function::New(env, GetIsa));
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
  k.Set("memcpy", Napi::Function::New(env, MemcpyJs));
  k.Set("memread", Napi::Function::New(env, MemreadJs));
  k.Set("fmaPeak", Napi::Function::New(env, FmaPeakJs));
  k.Set("poolF16", Napi::Function::New(env, PoolF16Js));
  exports.Set("kernels", k);
  return exports;
}

}  // namespace
}  // namespace ck

static Napi::Object InitModule(Napi::Env env, Napi::Object exports) { return ck::Init(env, exports); }

NODE_API_MODULE(continuum_native, InitModule)
