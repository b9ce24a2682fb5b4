// The binding's `Engine` class: weights, page pools, step, page transfers.
// Every real-work call runs off the JS thread on one of the engine's two
// queues (async_queue.h) and returns a promise; its inputs are checked here
// first, so bad input throws synchronously and nothing is queued.
#include "binding_engine.h"

#include <napi.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "async_queue.h"
#include "backend.h"
#include "binding_args.h"
#include "engine.h"

namespace ck {
namespace {

constexpr size_t kQueueCapacity = 1024;

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

struct CommitPoolJob : Job {
  Backend* engine;
  CommitPoolJob(Napi::Env env, Backend* e) : Job(env), engine(e) {}
  void execute() override { engine->commit_pool(); }
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
                           InstanceMethod<&EngineWrap::CommitPool>("commitPool"),
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

  // On the compute queue, so it is ordered before any step submitted after it.
  Napi::Value CommitPool(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Backend* e = live(env);
    need(env, e->has_pool(), "commitPool: the engine has no page pool (createPool first)");
    auto* job = new CommitPoolJob(env, e);
    job->keep(Value());
    return compute_->submit(env, job);
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

}  // namespace

Napi::Function engine_class(Napi::Env env) { return EngineWrap::Init(env); }

}  // namespace ck
