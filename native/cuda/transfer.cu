// Page download / upload / copy on a copy stream apart from compute, through a
// bounded pool of pinned staging slabs. Every page of every layer is one
// contiguous run in its pool (the page is the outermost index), so a transfer
// is n_pages * n_layers * 2 cudaMemcpyAsync calls between the pools and the
// slab; the slab makes the host side page-locked, so the copies run
// asynchronously at full PCIe rate, and lets the caller's buffer be pageable.
#include <cstring>
#include <string>
#include <vector>

#include "kernels_cuda.cuh"

namespace ck::cuda {

enum class TransferKind : int32_t { Download, Upload, Copy };

struct PageTransfer::Ticket {
  bool in_use = false;
  TransferKind kind = TransferKind::Copy;
  int32_t slab = -1;          // index of the staging slab, -1 for a copy
  void* host_dst = nullptr;   // download: where the slab goes when done
  size_t bytes = 0;           // download: bytes to hand over
  cudaEvent_t done = nullptr;  // recorded on the copy stream after the last copy
};

size_t host_bytes_per_page(const KvPools& pools) {
  return static_cast<size_t>(pools.n_layers) * (pools.k_page_bytes + pools.v_page_bytes);
}

// Slab occupancy lives beside the tickets: slab i is busy iff a ticket in use
// holds it. Derived on demand rather than stored twice, so the two never drift.
int32_t PageTransfer::free_slabs() const {
  int32_t busy = 0;
  for (int32_t i = 0; i < kMaxTransferTickets; ++i)
    if (tickets_[i].in_use && tickets_[i].slab >= 0) ++busy;
  return slab_count_ - busy;
}

PageTransfer::PageTransfer(const KvPools& pools, cudaStream_t compute, int32_t slab_count, size_t slab_bytes)
    : pools_(pools), compute_(compute), slab_count_(slab_count), slab_bytes_(slab_bytes) {
  CK_REQUIRE(pools.n_layers > 0 && pools.num_pages > 0 && pools.k_page_bytes > 0 && pools.v_page_bytes > 0,
             "PageTransfer: bad pool geometry");
  CK_REQUIRE(pools.k != nullptr && pools.v != nullptr, "PageTransfer: missing pool pointers");
  CK_REQUIRE(slab_count >= 1 && slab_count <= kMaxTransferTickets, "PageTransfer: slab_count must be 1..64");
  CK_REQUIRE(slab_bytes >= host_bytes_per_page(pools), "PageTransfer: a slab must hold at least one page");
  CK_REQUIRE(slab_bytes <= kMaxPinnedBytes / static_cast<size_t>(slab_count),
             "PageTransfer: slab_count * slab_bytes exceeds kMaxPinnedBytes");
  // Own copies of the per-layer pointer arrays: the caller's may not outlive us.
  layer_k_.assign(pools.k, pools.k + pools.n_layers);
  layer_v_.assign(pools.v, pools.v + pools.n_layers);
  pools_.k = layer_k_.data();
  pools_.v = layer_v_.data();
  tickets_ = new Ticket[kMaxTransferTickets];
  try {
    CK_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    CK_CUDA(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    for (int32_t i = 0; i < kMaxTransferTickets; ++i)
      CK_CUDA(cudaEventCreateWithFlags(&tickets_[i].done, cudaEventDisableTiming));
    CK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&pinned_), static_cast<size_t>(slab_count) * slab_bytes,
                          cudaHostAllocDefault));
  } catch (...) {
    release_all();
    throw;
  }
}

void PageTransfer::release_all() noexcept {
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  pinned_ = nullptr;
  if (tickets_ != nullptr) {
    for (int32_t i = 0; i < kMaxTransferTickets; ++i)
      if (tickets_[i].done != nullptr) cudaEventDestroy(tickets_[i].done);
    delete[] tickets_;
    tickets_ = nullptr;
  }
  if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
  compute_mark_ = nullptr;
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  copy_ = nullptr;
}

PageTransfer::~PageTransfer() { release_all(); }

void PageTransfer::check_pages(const int32_t* pages, int32_t n_pages, const char* what) const {
  CK_REQUIRE(pages != nullptr && n_pages > 0, std::string(what) + ": empty page list");
  for (int32_t i = 0; i < n_pages; ++i)
    CK_REQUIRE(pages[i] >= 0 && pages[i] < pools_.num_pages,
               std::string(what) + ": page " + std::to_string(pages[i]) + " at index " + std::to_string(i) +
                   " is outside [0, " + std::to_string(pools_.num_pages) + ")");
}

int32_t PageTransfer::acquire_ticket(bool needs_slab) {
  int32_t slab = -1;
  if (needs_slab) {
    std::vector<bool> busy(static_cast<size_t>(slab_count_), false);
    for (int32_t i = 0; i < kMaxTransferTickets; ++i)
      if (tickets_[i].in_use && tickets_[i].slab >= 0) busy[static_cast<size_t>(tickets_[i].slab)] = true;
    for (int32_t s = 0; s < slab_count_ && slab < 0; ++s)
      if (!busy[static_cast<size_t>(s)]) slab = s;
    if (slab < 0) return -1;
  }
  for (int32_t i = 0; i < kMaxTransferTickets; ++i) {
    if (!tickets_[i].in_use) {
      tickets_[i].in_use = true;
      tickets_[i].slab = slab;
      tickets_[i].host_dst = nullptr;
      tickets_[i].bytes = 0;
      return i;
    }
  }
  return -1;
}

// Queues on the copy stream a device-side wait for everything queued on the
// compute stream so far.
void PageTransfer::follow_compute() {
  CK_CUDA(cudaEventRecord(compute_mark_, compute_));
  CK_CUDA(cudaStreamWaitEvent(copy_, compute_mark_, 0));
}

int32_t PageTransfer::begin_download(const int32_t* pages, int32_t n_pages, void* host) {
  check_pages(pages, n_pages, "download");
  CK_REQUIRE(host != nullptr, "download: null host buffer");
  const size_t bpp = host_bytes_per_page(pools_);
  const size_t bytes = static_cast<size_t>(n_pages) * bpp;
  CK_REQUIRE(bytes <= slab_bytes_, "download: " + std::to_string(bytes) + " bytes exceed one staging slab of " +
                                       std::to_string(slab_bytes_) + "; split the page list");
  const int32_t id = acquire_ticket(true);
  if (id < 0) return -1;
  Ticket& tk = tickets_[id];
  try {
    tk.kind = TransferKind::Download;
    tk.host_dst = host;
    tk.bytes = bytes;
    unsigned char* slab = pinned_ + static_cast<size_t>(tk.slab) * slab_bytes_;
    follow_compute();
    for (int32_t i = 0; i < n_pages; ++i) {
      unsigned char* dst = slab + static_cast<size_t>(i) * bpp;
      for (int32_t l = 0; l < pools_.n_layers; ++l) {
        const auto* k = reinterpret_cast<const unsigned char*>(pools_.k[l]) + pages[i] * pools_.k_page_bytes;
        const auto* v = reinterpret_cast<const unsigned char*>(pools_.v[l]) + pages[i] * pools_.v_page_bytes;
        CK_CUDA(cudaMemcpyAsync(dst, k, pools_.k_page_bytes, cudaMemcpyDeviceToHost, copy_));
        dst += pools_.k_page_bytes;
        CK_CUDA(cudaMemcpyAsync(dst, v, pools_.v_page_bytes, cudaMemcpyDeviceToHost, copy_));
        dst += pools_.v_page_bytes;
      }
    }
    CK_CUDA(cudaEventRecord(tk.done, copy_));
  } catch (...) {
    cudaStreamSynchronize(copy_);  // let queued copies into the slab finish before it is reused
    tk.in_use = false;
    throw;
  }
  return id;
}

int32_t PageTransfer::begin_upload(const int32_t* pages, int32_t n_pages, const void* host) {
  check_pages(pages, n_pages, "upload");
  CK_REQUIRE(host != nullptr, "upload: null host buffer");
  for (int32_t i = 0; i < n_pages; ++i)
    for (int32_t j = 0; j < i; ++j)
      CK_REQUIRE(pages[i] != pages[j], "upload: page " + std::to_string(pages[i]) + " listed twice");
  const size_t bpp = host_bytes_per_page(pools_);
  const size_t bytes = static_cast<size_t>(n_pages) * bpp;
  CK_REQUIRE(bytes <= slab_bytes_, "upload: " + std::to_string(bytes) + " bytes exceed one staging slab of " +
                                     std::to_string(slab_bytes_) + "; split the page list");
  const int32_t id = acquire_ticket(true);
  if (id < 0) return -1;
  Ticket& tk = tickets_[id];
  try {
    tk.kind = TransferKind::Upload;
    unsigned char* slab = pinned_ + static_cast<size_t>(tk.slab) * slab_bytes_;
    std::memcpy(slab, host, bytes);
    follow_compute();
    const unsigned char* src = slab;
    for (int32_t i = 0; i < n_pages; ++i) {
      for (int32_t l = 0; l < pools_.n_layers; ++l) {
        auto* k = reinterpret_cast<unsigned char*>(pools_.k[l]) + pages[i] * pools_.k_page_bytes;
        auto* v = reinterpret_cast<unsigned char*>(pools_.v[l]) + pages[i] * pools_.v_page_bytes;
        CK_CUDA(cudaMemcpyAsync(k, src, pools_.k_page_bytes, cudaMemcpyHostToDevice, copy_));
        src += pools_.k_page_bytes;
        CK_CUDA(cudaMemcpyAsync(v, src, pools_.v_page_bytes, cudaMemcpyHostToDevice, copy_));
        src += pools_.v_page_bytes;
      }
    }
    CK_CUDA(cudaEventRecord(tk.done, copy_));
  } catch (...) {
    cudaStreamSynchronize(copy_);
    tk.in_use = false;
    throw;
  }
  return id;
}

int32_t PageTransfer::begin_copy(const int32_t* src, const int32_t* dst, int32_t n_pages) {
  check_pages(src, n_pages, "copy source");
  check_pages(dst, n_pages, "copy destination");
  for (int32_t i = 0; i < n_pages; ++i)
    for (int32_t j = 0; j < n_pages; ++j) {
      CK_REQUIRE(i == j || dst[i] != dst[j], "copy: destination page " + std::to_string(dst[i]) + " listed twice");
      CK_REQUIRE(dst[i] != src[j], "copy: page " + std::to_string(dst[i]) + " is both a source and a destination");
    }
  const int32_t id = acquire_ticket(false);
  CK_REQUIRE(id >= 0, "copy: " + std::to_string(kMaxTransferTickets) + " transfers already in flight");
  Ticket& tk = tickets_[id];
  try {
    tk.kind = TransferKind::Copy;
    follow_compute();
    for (int32_t i = 0; i < n_pages; ++i) {
      for (int32_t l = 0; l < pools_.n_layers; ++l) {
        auto* kb = reinterpret_cast<unsigned char*>(pools_.k[l]);
        auto* vb = reinterpret_cast<unsigned char*>(pools_.v[l]);
        CK_CUDA(cudaMemcpyAsync(kb + dst[i] * pools_.k_page_bytes, kb + src[i] * pools_.k_page_bytes,
                                pools_.k_page_bytes, cudaMemcpyDeviceToDevice, copy_));
        CK_CUDA(cudaMemcpyAsync(vb + dst[i] * pools_.v_page_bytes, vb + src[i] * pools_.v_page_bytes,
                                pools_.v_page_bytes, cudaMemcpyDeviceToDevice, copy_));
      }
    }
    CK_CUDA(cudaEventRecord(tk.done, copy_));
  } catch (...) {
    cudaStreamSynchronize(copy_);
    tk.in_use = false;
    throw;
  }
  return id;
}

void PageTransfer::finish(int32_t ticket) {
  Ticket& tk = tickets_[ticket];
  if (tk.kind == TransferKind::Download)
    std::memcpy(tk.host_dst, pinned_ + static_cast<size_t>(tk.slab) * slab_bytes_, tk.bytes);
  tk.in_use = false;
  tk.slab = -1;
}

TransferState PageTransfer::poll(int32_t ticket) {
  CK_REQUIRE(ticket >= 0 && ticket < kMaxTransferTickets && tickets_[ticket].in_use,
             "poll: ticket " + std::to_string(ticket) + " is not in flight");
  const cudaError_t e = cudaEventQuery(tickets_[ticket].done);
  if (e == cudaErrorNotReady) {
    // Not an error; make sure it is not left as the "last error" that the
    // next CK_LAUNCH would report.
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return TransferState::Pending;
  }
  CK_CUDA(e);
  finish(ticket);
  return TransferState::Done;
}

void PageTransfer::order_compute_after(int32_t ticket) {
  CK_REQUIRE(ticket >= 0 && ticket < kMaxTransferTickets && tickets_[ticket].in_use,
             "order_compute_after: ticket " + std::to_string(ticket) + " is not in flight");
  CK_CUDA(cudaStreamWaitEvent(compute_, tickets_[ticket].done, 0));
}

void PageTransfer::drain() {
  CK_CUDA(cudaStreamSynchronize(copy_));
  for (int32_t i = 0; i < kMaxTransferTickets; ++i)
    if (tickets_[i].in_use) finish(i);
}

}  // namespace ck::cuda
