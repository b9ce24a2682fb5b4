// The CUDA engine (engine_cuda.cuh) and the binding's view of the CUDA
// backend (cuda_probe, make_cuda_engine of backend.h).
#include "engine_cuda.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "f16.cuh"

namespace ck {

CudaProbe cuda_probe() {
  CudaProbe p;
  p.built = true;
  p.toolkit = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  p.numerics = cuda::kNumerics;
  int n = 0;
  // With the static runtime this is where libcuda.so is first looked for: on
  // a machine without a driver it fails here, with the reason, and nothing
  // else is touched.
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    p.reason = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return p;
  }
  p.devices = n;
  if (n == 0) {
    p.reason = "no CUDA device";
    return p;
  }
  // The engine runs on the current device (0 unless the process chose
  // another): its compute capability selects the machine code that runs.
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess) {
    p.arch = "sm" + std::to_string(major) + std::to_string(minor);
  } else {
    (void)cudaGetLastError();
    p.reason = "device 0: compute capability unreadable";
  }
  return p;
}

std::unique_ptr<Backend> make_cuda_engine(const ModelSpec& spec, std::vector<float> inv_freq) {
  return std::make_unique<cuda::CudaEngine>(spec, std::move(inv_freq));
}

double cuda_copy_gb_per_s(size_t bytes) {
  const CudaProbe probe = cuda_probe();
  if (probe.devices == 0) throw std::runtime_error("cuda copy bandwidth: no usable device (" + probe.reason + ")");
  cuda::DeviceBuffer src(bytes), dst(bytes);
  cudaStream_t stream = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  std::vector<float> ms;
  try {
    CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK_CUDA(cudaEventCreate(&a));
    CK_CUDA(cudaEventCreate(&b));
    CK_CUDA(cudaMemsetAsync(src.get(), 0x5a, bytes, stream));
    for (int i = 0; i < 13; ++i) {
      CK_CUDA(cudaEventRecord(a, stream));
      CK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
      CK_CUDA(cudaEventRecord(b, stream));
      CK_CUDA(cudaEventSynchronize(b));
      float t = 0;
      CK_CUDA(cudaEventElapsedTime(&t, a, b));
      if (i >= 3) ms.push_back(t);
    }
  } catch (...) {
    if (a != nullptr) cudaEventDestroy(a);
    if (b != nullptr) cudaEventDestroy(b);
    if (stream != nullptr) cudaStreamDestroy(stream);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(stream);
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (static_cast<double>(ms[ms.size() / 2]) * 1e6);
}

namespace cuda {

namespace {

__global__ void add_inplace_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] += y[i];
}

// x += y over n floats (the residual adds).
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535 * 8);
  add_inplace_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, y, n);
  CK_LAUNCH("add_inplace_kernel");
}

size_t f32_bytes(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float); }

}  // namespace

// ---- DeviceBuffer -------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) { reserve(bytes); }

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_ && ptr_ != nullptr) return;
  if (ptr_ != nullptr) CK_CUDA(cudaFree(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
  CK_CUDA(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)));
  bytes_ = bytes;
}

// ---- CudaEngine ----------------------------------------------------------------------

std::string CudaEngine::unsupported(const ModelSpec& s) {
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    return "headDim " + std::to_string(s.head_dim) + " is not supported by the CUDA attention kernels (64, 128 or 256)";
  if (s.v_head_dim != s.head_dim)
    return "vHeadDim " + std::to_string(s.v_head_dim) + " differs from headDim; the CUDA attention kernels need them equal";
  if (s.n_heads / s.n_kv > 16)
    return "nHeads / nKvHeads = " + std::to_string(s.n_heads / s.n_kv) + " exceeds the CUDA attention kernels' 16";
  if (s.hidden % 8 != 0 || s.ffn % 8 != 0)
    return "hidden " + std::to_string(s.hidden) + " and ffn " + std::to_string(s.ffn) +
           " must be multiples of 8 (the CUDA GEMM reads 16-byte rows of K)";
  return "";
}

CudaEngine::CudaEngine(const ModelSpec& spec, std::vector<float> inv_freq)
    : spec_(spec), layers_(static_cast<size_t>(spec.n_layers)) {
  const std::string why = unsupported(spec);
  if (!why.empty()) throw std::invalid_argument("cuda backend: " + why);
  const CudaProbe probe = cuda_probe();
  if (probe.devices == 0) throw std::runtime_error("cuda backend: no usable device (" + probe.reason + ")");
  CK_CUDA(cudaGetDevice(&device_));
  CK_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  inv_freq = per_layer_inv_freq(spec, std::move(inv_freq));
  inv_freq_.reserve(inv_freq.size() * sizeof(float));
  CK_CUDA(cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
}

CudaEngine::~CudaEngine() {
  // Nothing may be in flight when the buffers go: the binding has joined its
  // threads, so only device work can remain. Errors here have nowhere to go.
  transfer_.reset();
  if (compute_ != nullptr) {
    cudaStreamSynchronize(compute_);
    cudaStreamDestroy(compute_);
  }
}

std::string CudaEngine::set_weight(size_t index, DType dtype, const uint8_t* data, size_t bytes) {
  const std::string err = check_weight(spec_, index, dtype, bytes);
  if (!err.empty()) return err;
  const WeightPlace place = weight_place(spec_, index);
  DeviceLayer* L = place.layer >= 0 ? &layers_[static_cast<size_t>(place.layer)] : nullptr;
  auto load = [&](DeviceWeight& w) {
    if (spec_.norm_offset && is_norm(place.role)) {
      // Gemma's (1 + w) in f32, as the CPU engine keeps it (engine.cc: set_weight).
      const size_t n = bytes / (dtype == DType::F32 ? 4 : 2);
      std::vector<float> f(n);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = 0;
        float x = 0.0f;
        switch (dtype) {
          case DType::F32: std::memcpy(&x, data + 4 * i, 4); break;
          case DType::F16: std::memcpy(&h, data + 2 * i, 2), x = f16_to_f32_exact(h); break;
          case DType::BF16: std::memcpy(&h, data + 2 * i, 2), x = bf16_to_f32_exact(h); break;
          default: break;  // check_weight admits block formats only for matrices and the embedding
        }
        f[i] = 1.0f + x;
      }
      w.dtype = DType::F32;
      w.data.reserve(n * sizeof(float));
      CK_CUDA(cudaMemcpy(w.data.get(), f.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      return;
    }
    w.dtype = dtype;
    w.data.reserve(bytes);
    CK_CUDA(cudaMemcpy(w.data.get(), data, bytes, cudaMemcpyHostToDevice));
  };
  // Biases are f32 on the device whatever their storage (the matmul adds f32).
  auto load_bias = [&](DeviceBuffer& b) {
    const size_t n = bytes / (dtype == DType::F32 ? 4 : 2);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = 0;
      switch (dtype) {
        case DType::F32: std::memcpy(&f[i], data + 4 * i, 4); break;
        case DType::F16: std::memcpy(&h, data + 2 * i, 2), f[i] = f16_to_f32_exact(h); break;
        case DType::BF16: std::memcpy(&h, data + 2 * i, 2), f[i] = bf16_to_f32_exact(h); break;
        default: break;  // biases are never quantized (check_weight)
      }
    }
    b.reserve(n * sizeof(float));
    CK_CUDA(cudaMemcpy(b.get(), f.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  };
  switch (place.role) {
    case WeightRole::Embed: load(embed_); break;
    case WeightRole::InputNorm: load(L->input_norm); break;
    case WeightRole::Q: load(L->q); break;
    case WeightRole::K: load(L->k); break;
    case WeightRole::V: load(L->v); break;
    case WeightRole::QBias: load_bias(L->q_bias); break;
    case WeightRole::KBias: load_bias(L->k_bias); break;
    case WeightRole::VBias: load_bias(L->v_bias); break;
    case WeightRole::QNorm: load(L->q_norm); break;
    case WeightRole::KNorm: load(L->k_norm); break;
    case WeightRole::O: load(L->o); break;
    case WeightRole::AttnOutNorm: load(L->attn_out_norm); break;
    case WeightRole::MlpNorm: load(L->mlp_norm); break;
    case WeightRole::MlpOutNorm: load(L->mlp_out_norm); break;
    case WeightRole::Gate: load(L->gate); break;
    case WeightRole::Up: load(L->up); break;
    case WeightRole::Down: load(L->down); break;
    case WeightRole::FinalNorm: load(final_norm_); break;
    case WeightRole::LmHead: load(lm_head_); break;
  }
  return "";
}

std::string CudaEngine::allocate_pool(int64_t num_pages, int32_t page_size) {
  const size_t kb = static_cast<size_t>(page_size) * spec_.n_kv * spec_.head_dim * sizeof(f16);
  const size_t vb = static_cast<size_t>(page_size) * spec_.n_kv * spec_.v_head_dim * sizeof(f16);
  std::vector<DeviceBuffer> k, v;
  try {
    for (int32_t l = 0; l < groups_.n_slots; ++l) {
      k.emplace_back(kb * static_cast<size_t>(num_pages));
      v.emplace_back(vb * static_cast<size_t>(num_pages));
      CK_CUDA(cudaMemset(k.back().get(), 0, k.back().bytes()));
      CK_CUDA(cudaMemset(v.back().get(), 0, v.back().bytes()));
    }
    std::vector<f16*> kp, vp;
    for (int32_t l = 0; l < groups_.n_slots; ++l) {
      kp.push_back(k[static_cast<size_t>(l)].as<f16>());
      vp.push_back(v[static_cast<size_t>(l)].as<f16>());
    }
    const KvPools pools{groups_.n_slots, num_pages, kb, vb, kp.data(), vp.data()};
    const size_t bpp = host_bytes_per_page(pools);
    const size_t pages_per_slab = std::clamp<size_t>(kTransferSlabTarget / bpp, 1, static_cast<size_t>(num_pages));
    transfer_ = std::make_unique<PageTransfer>(pools, compute_, kTransferSlabs, pages_per_slab * bpp);
  } catch (const std::exception& e) {
    return "createPool: device memory for " + std::to_string(num_pages) + " pages: " + e.what();
  }
  k_pages_ = std::move(k);
  v_pages_ = std::move(v);
  num_pages_ = num_pages;
  page_size_ = page_size;
  return "";
}

std::string CudaEngine::allocate_contiguous(int32_t num_seqs, int32_t ctx_cap) {
  const size_t slots = static_cast<size_t>(num_seqs) * static_cast<size_t>(ctx_cap);
  std::vector<DeviceBuffer> k, v;
  try {
    for (int32_t l = 0; l < spec_.n_layers; ++l) {
      k.emplace_back(slots * spec_.n_kv * spec_.head_dim * sizeof(f16));
      v.emplace_back(slots * spec_.n_kv * spec_.v_head_dim * sizeof(f16));
      CK_CUDA(cudaMemset(k.back().get(), 0, k.back().bytes()));
      CK_CUDA(cudaMemset(v.back().get(), 0, v.back().bytes()));
    }
  } catch (const std::exception& e) {
    return std::string("createContiguousCache: device memory: ") + e.what();
  }
  k_ctx_ = std::move(k);
  v_ctx_ = std::move(v);
  ctx_seqs_ = num_seqs;
  ctx_cap_ = ctx_cap;
  return "";
}

namespace {
// The attention launch puts rows on one grid dimension (at most 65535).
constexpr int32_t kMaxStepRows = 65535;
std::string check_rows(const StepBatch& b) {
  if (b.T() <= kMaxStepRows) return "";
  return "batch: " + std::to_string(b.T()) + " rows exceed the CUDA backend's " + std::to_string(kMaxStepRows) +
         " per step";
}
}  // namespace

std::string CudaEngine::validate_paged(const StepBatch& b) const {
  const std::string err = validate_paged_batch(b, spec_, groups_, num_pages_, page_size_);
  return err.empty() ? check_rows(b) : err;
}

std::string CudaEngine::validate_contiguous(const StepBatch& b) const {
  const std::string err = validate_contiguous_batch(b, spec_, ctx_seqs_, ctx_cap_);
  return err.empty() ? check_rows(b) : err;
}

void CudaEngine::step(const StepBatch& b, float* logits) { forward(b, Mode::Paged, logits); }
void CudaEngine::step_contiguous(const StepBatch& b, float* logits) { forward(b, Mode::Contiguous, logits); }

template <typename T>
void CudaEngine::upload(DeviceBuffer& dst, const std::vector<T>& src) {
  dst.reserve(src.size() * sizeof(T));
  if (!src.empty())
    CK_CUDA(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, compute_));
}

void CudaEngine::reserve_scratch(int32_t T, int32_t R, int32_t max_keys) {
  const ModelSpec& m = spec_;
  const int64_t H = m.hidden;
  x_.reserve(f32_bytes(T * H));
  h_.reserve(f32_bytes(T * H));
  o_.reserve(f32_bytes(T * H));
  q_.reserve(f32_bytes(int64_t{T} * m.n_heads * m.head_dim));
  k_.reserve(f32_bytes(int64_t{T} * m.n_kv * m.head_dim));
  v_.reserve(f32_bytes(int64_t{T} * m.n_kv * m.v_head_dim));
  attn_.reserve(f32_bytes(int64_t{T} * m.n_heads * m.v_head_dim));
  g_.reserve(f32_bytes(int64_t{T} * m.ffn));
  u_.reserve(f32_bytes(int64_t{T} * m.ffn));
  sel_.reserve(f32_bytes(R * H));
  nsel_.reserve(f32_bytes(R * H));
  logits_.reserve(f32_bytes(int64_t{R} * m.vocab));
  workspace_.reserve(attention_workspace_bytes(T, m.n_heads, m.v_head_dim, max_keys));
}

// The CPU engine's forward (engine.cc) step for step, on the compute stream.
void CudaEngine::forward(const StepBatch& b, Mode mode, float* logits) {
  CK_CUDA(cudaSetDevice(device_));
  const ModelSpec& m = spec_;
  const int32_t T = b.T();
  const int32_t R = static_cast<int32_t>(b.logit_rows.size());
  const int64_t H = m.hidden;
  const int32_t qn = m.n_heads * m.head_dim, kn = m.n_kv * m.head_dim, vn = m.n_kv * m.v_head_dim;
  const int32_t on = m.n_heads * m.v_head_dim;
  const float attn_scale = m.softmax_scale();
  const int32_t half = m.head_dim / 2;
  const int32_t max_keys = *std::max_element(b.positions.begin(), b.positions.end()) + 1;
  reserve_scratch(T, R, max_keys);
  profiler_.begin_step(compute_);

  upload(tokens_, b.tokens);
  upload(positions_, b.positions);
  upload(row_seq_, b.row_seq);
  if (mode == Mode::Paged) {
    upload(slots_, b.slots);
    upload(page_table_, b.page_table);
  } else {
    // Contiguous rows land at slot seq * ctx_cap + pos of the per-layer cache.
    std::vector<int32_t> ctx_slots(static_cast<size_t>(T));
    for (size_t t = 0; t < ctx_slots.size(); ++t) ctx_slots[t] = b.row_seq[t] * ctx_cap_ + b.positions[t];
    // A host-to-device copy from pageable memory returns once the source is
    // staged, so ctx_slots may go when upload() returns.
    upload(slots_, ctx_slots);
  }
  const int64_t num_slots = mode == Mode::Paged ? num_pages_ * page_size_ : int64_t{ctx_seqs_} * ctx_cap_;
  // Paged: layer l goes through its group's slot mapping and page table ([groups, T], [groups, S, ptStride]).
  const int64_t S = mode == Mode::Paged ? static_cast<int64_t>(b.page_table.size()) / (int64_t{groups_.n_groups} * b.pt_stride) : 0;
  const AttentionLaunch launch{max_keys, workspace_.get(), workspace_.bytes(), compute_};
  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* o = o_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();
  float* g = g_.as<float>();
  float* u = u_.as<float>();
  const int32_t* pos = positions_.as<int32_t>();

  // An RMSNorm of [rows, D] (Gemma's (1 + w) is in the weight already); y may be x.
  auto norm = [&](const float* in, const DeviceWeight& w, int32_t rows, int32_t D, float* y) {
    rmsnorm(in, w.data.get(), w.dtype, rows, D, m.rms_eps, y, compute_);
  };
  embed(tokens_.as<int32_t>(), T, embed_.data.get(), embed_.dtype, m.vocab, m.hidden, x, compute_);
  if (m.embed_scale != 1.0f) scale(x, T * H, m.embed_scale, compute_);
  for (int32_t l = 0; l < m.n_layers; ++l) {
    const DeviceLayer& L = layers_[static_cast<size_t>(l)];
    const float* inv_freq = inv_freq_.as<float>() + static_cast<size_t>(l) * half;
    const size_t store = mode == Mode::Paged ? static_cast<size_t>(groups_.slot[static_cast<size_t>(l)]) : static_cast<size_t>(l);
    const int64_t grp = mode == Mode::Paged ? groups_.group[static_cast<size_t>(l)] : 0;
    f16* kc = (mode == Mode::Paged ? k_pages_ : k_ctx_)[store].as<f16>();
    f16* vc = (mode == Mode::Paged ? v_pages_ : v_ctx_)[store].as<f16>();
    const int32_t* slots = slots_.as<int32_t>() + grp * T;
    norm(x, L.input_norm, T, m.hidden, h);
    gemm(h, T, m.hidden, L.q, qn, L.q_bias.as<float>(), q);
    gemm(h, T, m.hidden, L.k, kn, L.k_bias.as<float>(), k);
    gemm(h, T, m.hidden, L.v, vn, L.v_bias.as<float>(), v);
    if (m.qk_norm) {
      norm(q, L.q_norm, T * m.n_heads, m.head_dim, q);
      norm(k, L.k_norm, T * m.n_kv, m.head_dim, k);
    }
    rope(q, T, m.n_heads, m.head_dim, pos, inv_freq, compute_);
    rope(k, T, m.n_kv, m.head_dim, pos, inv_freq, compute_);
    if (m.rope_scale != 1.0f) {
      scale(q, int64_t{T} * qn, m.rope_scale, compute_);
      scale(k, int64_t{T} * kn, m.rope_scale, compute_);
    }
    routed_append(k, slots, T, kn, num_slots, kc, compute_);
    routed_append(v, slots, T, vn, num_slots, vc, compute_);
    profiler_.begin(StepPart::Attention, compute_);
    if (mode == Mode::Paged) {
      const PagedAttention a{q, kc, vc, page_table_.as<int32_t>() + grp * S * b.pt_stride, row_seq_.as<int32_t>(), pos, attn,
                             T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, page_size_, b.pt_stride, num_pages_, attn_scale,
                             m.window_of(l), m.attn_softcap};
      paged_attention(a, launch);
    } else {
      const ContiguousAttention a{q, kc, vc, row_seq_.as<int32_t>(), pos, attn,
                                  T, m.n_heads, m.n_kv, m.head_dim, m.v_head_dim, ctx_cap_, attn_scale,
                                  m.window_of(l), m.attn_softcap};
      contiguous_attention(a, launch);
    }
    profiler_.end(StepPart::Attention, compute_);
    gemm(attn, T, on, L.o, m.hidden, nullptr, o);
    if (m.sandwich_norms) norm(o, L.attn_out_norm, T, m.hidden, o);
    add_inplace(x, o, T * H, compute_);
    norm(x, L.mlp_norm, T, m.hidden, h);
    gemm(h, T, m.hidden, L.gate, m.ffn, nullptr, g);
    gemm(h, T, m.hidden, L.up, m.ffn, nullptr, u);
    if (m.activation == Activation::GeluTanh) geglu(g, u, T, m.ffn, g, compute_);
    else swiglu(g, u, T, m.ffn, g, compute_);
    gemm(g, T, m.ffn, L.down, m.hidden, nullptr, o);
    if (m.sandwich_norms) norm(o, L.mlp_out_norm, T, m.hidden, o);
    add_inplace(x, o, T * H, compute_);
  }
  if (R > 0) {
    // Final norm and the LM head only for the rows that need logits.
    for (int32_t r = 0; r < R; ++r)
      CK_CUDA(cudaMemcpyAsync(sel_.as<float>() + r * H, x + b.logit_rows[static_cast<size_t>(r)] * H,
                              static_cast<size_t>(H) * sizeof(float), cudaMemcpyDeviceToDevice, compute_));
    norm(sel_.as<float>(), final_norm_, R, m.hidden, nsel_.as<float>());
    const DeviceWeight& head = m.tied_embeddings ? embed_ : lm_head_;
    gemm(nsel_.as<float>(), R, m.hidden, head, m.vocab, nullptr, logits_.as<float>());
    if (m.final_softcap > 0.0f) softcap(logits_.as<float>(), int64_t{R} * m.vocab, m.final_softcap, compute_);
    CK_CUDA(cudaMemcpyAsync(logits, logits_.get(), static_cast<size_t>(R) * m.vocab * sizeof(float),
                            cudaMemcpyDeviceToHost, compute_));
  }
  // Also where an error inside any kernel of this step surfaces.
  CK_CUDA(cudaStreamSynchronize(compute_));
  profiler_.end_step_synchronized(compute_);
}

void CudaEngine::gemm(const float* x, int32_t T, int32_t K, const DeviceWeight& w, int32_t N, const float* bias,
                      float* y) {
  profiler_.begin(StepPart::Gemm, compute_);
  matmul(x, T, K, w.data.get(), w.dtype, N, bias, y, compute_, &gemm_ws_);
  profiler_.end(StepPart::Gemm, compute_);
}

std::string CudaEngine::validate_pages(const std::vector<int32_t>& ids) const {
  return validate_page_ids(ids, num_pages_);
}

template <typename Begin>
void CudaEngine::transfer_chunks(const std::vector<int32_t>& ids, Begin begin) {
  CK_CUDA(cudaSetDevice(device_));
  const size_t bpp = static_cast<size_t>(page_bytes());
  const size_t per_chunk = transfer_->slab_bytes() / bpp;
  for (size_t first = 0; first < ids.size(); first += per_chunk) {
    const auto n = static_cast<int32_t>(std::min(per_chunk, ids.size() - first));
    // Both slabs busy: wait for the chunks in flight, then the slab is free.
    if (begin(first, n) < 0) {
      transfer_->drain();
      CK_REQUIRE(begin(first, n) >= 0, "transfer: no staging slab free after drain");
    }
  }
  transfer_->drain();
}

void CudaEngine::download_pages(const std::vector<int32_t>& ids, uint8_t* out) {
  const size_t bpp = static_cast<size_t>(page_bytes());
  transfer_chunks(ids, [&](size_t first, int32_t n) {
    return transfer_->begin_download(ids.data() + first, n, out + first * bpp);
  });
}

void CudaEngine::upload_pages(const std::vector<int32_t>& ids, const uint8_t* in) {
  const size_t bpp = static_cast<size_t>(page_bytes());
  transfer_chunks(ids, [&](size_t first, int32_t n) {
    return transfer_->begin_upload(ids.data() + first, n, in + first * bpp);
  });
}

void CudaEngine::copy_page(int32_t src, int32_t dst) {
  CK_CUDA(cudaSetDevice(device_));
  transfer_->begin_copy(&src, &dst, 1);
  transfer_->drain();
}

}  // namespace cuda
}  // namespace ck
