// fresh_pinned.cpp — page-locked host memory for pause backups, at the
// speed the kernel can hand out fresh pages rather than cuMemHostAlloc's.
//
// A pause whose tag does not keep its host backup (torch_memory_saver's
// default, through the drop-in) allocates the buffer at every pause, and
// cuMemHostAlloc of fresh memory runs at 1.4-2.4 GiB/s on an H200
// (docs/BENCHMARKS.md section 9), a twentieth of the copy into it.  Most of
// that is the kernel zeroing 4 KiB pages one thread at a time.  Large
// buffers are therefore made as anonymous mappings asking for huge pages,
// populated by several threads at once (MADV_POPULATE_WRITE, or a write per
// page on kernels before 5.14), then registered with cuMemHostRegister:
// a probe on an H200 measured 12.9-14.3 GiB/s for the populating with 8
// threads and 43-49 GiB/s for the registration, and a first pause of 1-16
// GiB went from 1.4-2.4 to 6.0-6.3 GiB/s (docs/BENCHMARKS.md section 9).
//
// Registered memory is page-locked as cuMemHostAlloc's is (the copies stay
// asynchronous DMA) and is given back with cuMemHostUnregister + munmap, so
// the process's resident memory drops by the whole buffer, as TMS's
// test_cpu_backup_rss checks.  The sizes of the mappings are kept here (the
// backend's host_free has only the pointer).
#include "fresh_pinned.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace cachalloc::shim {
namespace {

// Up to this, cuMemHostAlloc: a thread's start costs more than the pages,
// and the disk backups' staging (two 64 MiB halves in one buffer, kept for
// the process's life: pause_disk.cpp) gains nothing from speed.
constexpr std::size_t kMaxHostAllocBytes = 128ull << 20;
constexpr std::size_t kHugePage = 2ull << 20;
constexpr std::size_t kSliceBytes = 256ull << 20;  // at least this much per populating thread
constexpr unsigned kMaxThreads = 8;

std::mutex g_mutex;
std::vector<std::pair<void*, std::size_t>>& mappings() {
  static auto* v = new std::vector<std::pair<void*, std::size_t>>();  // leaked: frees may come during exit
  return *v;
}

// Faults in [p, p+n) for writing: one madvise, or a write per page.
void populate_range(char* p, std::size_t n) {
  if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t off = 0; off < n; off += page) p[off] = 0;
}

// Populates [p, p+n) with up to kMaxThreads threads (slices of whole huge
// pages); where a thread cannot start, the calling thread does its slice.
void populate(char* p, std::size_t n) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto threads = static_cast<unsigned>(
      std::clamp<std::size_t>(n / kSliceBytes, 1, std::min<std::size_t>(kMaxThreads, cores)));
  const std::size_t slice = (n / threads + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<std::thread> workers;
  for (unsigned i = 1; i < threads; ++i) {
    const std::size_t at = i * slice;
    if (at >= n) break;
    const std::size_t len = std::min(slice, n - at);
    try {
      workers.emplace_back(populate_range, p + at, len);
    } catch (...) {
      populate_range(p + at, len);
    }
  }
  populate_range(p, std::min(slice, n));
  for (std::thread& t : workers) t.join();
}

}  // namespace

CUresult fresh_pinned_alloc(const RealDriver* d, std::size_t size, void** out) {
  const bool can_register = d->cuMemHostRegister_v2 != nullptr && d->cuMemHostUnregister != nullptr;
  if (size <= kMaxHostAllocBytes || !can_register) {
    if (d->cuMemHostAlloc == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return d->cuMemHostAlloc(out, size, 0u);
  }
  const std::size_t len = (size + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ::madvise(p, len, MADV_HUGEPAGE);  // (a hint: without it, 4 KiB pages)
  try {
    populate(static_cast<char*>(p), len);
    const CUresult r = d->cuMemHostRegister_v2(p, len, 0u);
    if (r != CUDA_SUCCESS) {
      ::munmap(p, len);
      return d->cuMemHostAlloc != nullptr ? d->cuMemHostAlloc(out, size, 0u) : r;
    }
    std::lock_guard lock(g_mutex);
    mappings().emplace_back(p, len);
  } catch (...) {  // (the bookkeeping's allocation)
    if (d->cuMemHostUnregister != nullptr) d->cuMemHostUnregister(p);
    ::munmap(p, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = p;
  return CUDA_SUCCESS;
}

void fresh_pinned_free(const RealDriver* d, void* ptr) {
  std::size_t len = 0;
  {
    std::lock_guard lock(g_mutex);
    auto& v = mappings();
    auto it = std::find_if(v.begin(), v.end(), [&](const auto& m) { return m.first == ptr; });
    if (it != v.end()) {
      len = it->second;
      v.erase(it);
    }
  }
  if (len == 0) {
    if (d->cuMemFreeHost != nullptr) d->cuMemFreeHost(ptr);
    return;
  }
  d->cuMemHostUnregister(ptr);
  ::munmap(ptr, len);
}

}  // namespace cachalloc::shim
