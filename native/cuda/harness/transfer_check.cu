// The page transfers of the CUDA backend (PageTransfer: downloads, uploads
// and copies through pinned slabs) in the harness: scattered pages against
// the host images, an upload + copy + download round trip, the slab bound,
// and a refused page out of range.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../kernels_cuda.cuh"
#include "harness.cuh"

namespace ck::harness {

void check_transfers(Tally& tally, std::mt19937_64& rng) {
  const int32_t n_layers = 4, num_pages = 64, page_size = 16, n_kv = 8, head_dim = 128;
  const size_t page_elems = static_cast<size_t>(page_size) * n_kv * head_dim;
  std::vector<std::vector<f16>> hk, hv;
  std::vector<f16*> dk, dv;
  for (int32_t l = 0; l < n_layers; ++l) {
    hk.push_back(rand_f16(rng, page_elems * num_pages));
    hv.push_back(rand_f16(rng, page_elems * num_pages));
    f16 *k = nullptr, *v = nullptr;
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), page_elems * num_pages * 2));
    CK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), page_elems * num_pages * 2));
    CK_CUDA(cudaMemcpy(k, hk.back().data(), page_elems * num_pages * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(v, hv.back().data(), page_elems * num_pages * 2, cudaMemcpyHostToDevice));
    dk.push_back(k);
    dv.push_back(v);
  }
  const ck::cuda::KvPools pools{n_layers, num_pages, page_elems * 2, page_elems * 2, dk.data(), dv.data()};
  const size_t bpp = ck::cuda::host_bytes_per_page(pools);
  cudaStream_t compute;
  CK_CUDA(cudaStreamCreate(&compute));
  {
    ck::cuda::PageTransfer xfer(pools, compute, 2, 8 * bpp);
    auto wait = [&](int32_t t) {
      while (xfer.poll(t) == ck::cuda::TransferState::Pending) std::this_thread::yield();
    };
    // Download 5 scattered pages; compare with the host copies.
    const std::vector<int32_t> pages = {17, 3, 60, 4, 33};
    std::vector<unsigned char> host(pages.size() * bpp, 0xab);
    const int32_t t1 = xfer.begin_download(pages.data(), 5, host.data());
    wait(t1);
    bool ok = true;
    for (size_t i = 0; i < pages.size(); ++i)
      for (int32_t l = 0; l < n_layers; ++l) {
        const unsigned char* p = host.data() + i * bpp + static_cast<size_t>(l) * 2 * page_elems * 2;
        ok = ok && std::memcmp(p, &hk[static_cast<size_t>(l)][static_cast<size_t>(pages[i]) * page_elems],
                               page_elems * 2) == 0;
        ok = ok && std::memcmp(p + page_elems * 2,
                               &hv[static_cast<size_t>(l)][static_cast<size_t>(pages[i]) * page_elems],
                               page_elems * 2) == 0;
      }
    tally.check(ok, "page download (5 pages x 4 layers)", "host image equals the pools, page-major");

    // Upload that image to other pages, copy them on, download, compare.
    const std::vector<int32_t> up = {40, 41, 2, 50, 9}, cp = {11, 12, 13, 14, 15};
    const int32_t t2 = xfer.begin_upload(up.data(), 5, host.data());
    wait(t2);
    const int32_t t3 = xfer.begin_copy(up.data(), cp.data(), 5);
    wait(t3);
    std::vector<unsigned char> back(host.size(), 0);
    const int32_t t4 = xfer.begin_download(cp.data(), 5, back.data());
    wait(t4);
    tally.check(back == host, "page upload + copy + download round trip", "bytes identical");

    // Slab bound: two slabs, the third concurrent transfer is refused.
    const int32_t a = xfer.begin_download(pages.data(), 1, host.data());
    const int32_t b = xfer.begin_download(pages.data(), 1, host.data());
    const int32_t c = xfer.begin_download(pages.data(), 1, host.data());
    tally.check(a >= 0 && b >= 0 && c == -1 && xfer.free_slabs() == 0, "pinned slab bound",
                "2 slabs: third transfer refused (-1)");
    xfer.drain();
    tally.check(xfer.free_slabs() == 2, "drain releases every slab", std::to_string(xfer.free_slabs()) + " free");

    // Bad input: a page out of range throws and queues nothing.
    const std::vector<int32_t> bad = {1, num_pages};
    bool threw = false;
    try {
      xfer.begin_upload(bad.data(), 2, host.data());
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    tally.check(threw && xfer.free_slabs() == 2, "transfer rejects a page out of range", "invalid_argument, no slab taken");
  }
  CK_CUDA(cudaStreamDestroy(compute));
  for (int32_t l = 0; l < n_layers; ++l) {
    CK_CUDA(cudaFree(dk[static_cast<size_t>(l)]));
    CK_CUDA(cudaFree(dv[static_cast<size_t>(l)]));
  }
}

}  // namespace ck::harness
