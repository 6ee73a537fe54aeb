// host_ops.cpp — serving and freeing pinned host memory through the cache.
#include "host_ops.h"

#include <atomic>
#include <mutex>

#include "context_registry.h"
#include "cuda_host_backend.h"
#include "real_driver.h"
#include "report_source.h"
#include "start_up.h"

namespace cachalloc::shim {
namespace {

std::atomic<HostCache*> g_cache{nullptr};

// Created at the first pinned allocation the cache may serve; never
// destroyed (hooks run during exit, and the driver may be gone by then).
HostCache* cache() {
  HostCache* c = g_cache.load(std::memory_order_acquire);
  if (c != nullptr) [[likely]] return c;
  static std::once_flag once;
  std::call_once(once, [] {
    auto* backend = new CudaHostBackend(real_driver());
    set_context_retired_listener(host_context_retired);  // before the cache can own a block
    auto* created = new HostCache(backend, config().pinned_max_cached);
    note_host_cache(created);  // for the reports, before any hook can find it
    g_cache.store(created, std::memory_order_release);
  });
  return g_cache.load(std::memory_order_acquire);
}

bool may_serve(std::size_t size, unsigned flags) {
  if (!serving(current_mode()) || config().pinned_max_cached == 0) return false;
  const RealDriver* d = real_driver();
  return size != 0 && HostCache::class_size(size) != 0 && (flags & ~kHostAllocFlagMask) == 0 &&
         d->cuMemHostAlloc != nullptr && d->cuMemFreeHost != nullptr;
}

// A cached block, but not live memory of the program at `p`: freed, or
// past the requested size.  (Not serving — a forked child, exiting — the
// driver answers for everything.)
bool cached_not_live(const void* p) {
  HostBlockInfo info;
  if (!serving(current_mode()) || !host_block_of(p, &info)) return false;
  const auto offset = static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(info.base));
  return !info.live || offset >= info.requested;
}

// `p` lies in the requested bytes of a block the program holds; *info is
// that block (its flags are the ones the program asked: the pool's).
bool live_block_at(const void* p, HostBlockInfo* info) {
  if (!host_block_of(p, info) || !info->live) return false;
  return static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(info->base)) < info->requested;
}

}  // namespace

HostCache* host_cache_if_any() { return g_cache.load(std::memory_order_acquire); }

bool host_block_of(const void* p, HostBlockInfo* info) {
  HostCache* c = host_cache_if_any();
  return c != nullptr && c->lookup(p, info);
}

void host_context_retired(ContextState* ctx) {
  if (HostCache* c = host_cache_if_any()) c->forget_owner(reinterpret_cast<std::uintptr_t>(ctx));
}

// The current context's state (unique for the context's lifetime) keys
// and owns every block it allocated, portable ones too (its death frees
// them: core/host_cache.h), and becomes known to the registry so that
// later fences cover its streams.
Status host_cache_alloc(void** pp, std::size_t size, unsigned flags) {
  if (pp == nullptr || !may_serve(size, flags)) return kNotOwned;
  ContextState* ctx = current_context_state();
  if (ctx == nullptr) return kNotOwned;
  const Status s = cache()->allocate(size, flags, reinterpret_cast<std::uintptr_t>(ctx), pp);
  // Out of memory for the whole size class even with the cache emptied: the
  // driver may still have the exact size (a 40 GiB request is 64 GiB to
  // the cache).  It answers, uncached, as it would without cachalloc.
  return s == kOutOfMemory ? kNotOwned : s;
}

// While exiting a free of a cached block is a no-op (no driver call from
// exit handlers, as for device blocks); a forked child's memory is the
// driver's business.
Status host_cache_free(void* p) {
  HostCache* c = host_cache_if_any();
  if (c == nullptr || p == nullptr) return kNotOwned;
  const Mode m = current_mode();
  if (m == Mode::exiting) return c->owns(p) ? kSuccess : kNotOwned;
  if (!serving(m)) return kNotOwned;
  return c->free(p);
}

CUresult do_mem_host_alloc(void** pp, std::size_t size, unsigned flags) {
  const Status s = host_cache_alloc(pp, size, flags);
  if (s != kNotOwned) return static_cast<CUresult>(s);
  const RealDriver* d = real_driver();
  return d->cuMemHostAlloc ? d->cuMemHostAlloc(pp, size, flags) : CUDA_ERROR_NOT_FOUND;
}

// cuMemAllocHost is cuMemHostAlloc with no flag.
CUresult do_mem_alloc_host(void** pp, std::size_t size) {
  const Status s = host_cache_alloc(pp, size, 0);
  if (s != kNotOwned) return static_cast<CUresult>(s);
  const RealDriver* d = real_driver();
  return d->cuMemAllocHost_v2 ? d->cuMemAllocHost_v2(pp, size) : CUDA_ERROR_NOT_FOUND;
}

CUresult do_mem_free_host(void* p) {
  const Status s = host_cache_free(p);
  if (s != kNotOwned) return static_cast<CUresult>(s);
  const RealDriver* d = real_driver();
  return d->cuMemFreeHost ? d->cuMemFreeHost(p) : CUDA_ERROR_NOT_FOUND;
}

// The driver carves small pinned allocations from larger chunks and
// answers cuMemHostGetFlags with the chunk's flags, those of the allocation
// that created it (H100, driver 580: with a flags-0 allocation live, a
// PORTABLE one placed beside it reports 0x2, 0x3 in a fresh process).  A
// cached block keeps its chunk alive after the program's free, so under
// cachalloc a later portable block lands in a flags-0 chunk where a bare
// run's would start a fresh one.  A live block therefore answers what the
// driver answers for a fresh allocation of the flags the program asked:
// those flags, plus DEVICEMAP where the driver adds it (unified
// addressing: asked | DEVICEMAP, measured for all eight combinations).
// The driver is still asked, for its error codes and that one bit.
CUresult do_mem_host_get_flags(unsigned* flags, void* p) {
  if (cached_not_live(p)) return CUDA_ERROR_INVALID_VALUE;
  const RealDriver* d = real_driver();
  if (d->cuMemHostGetFlags == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = d->cuMemHostGetFlags(flags, p);
  HostBlockInfo info;
  if (r == CUDA_SUCCESS && serving(current_mode()) && live_block_at(p, &info))
    *flags = info.flags | (*flags & CU_MEMHOSTALLOC_DEVICEMAP);
  return r;
}

CUresult do_mem_host_get_device_pointer(CUdeviceptr* out, void* p, unsigned flags) {
  if (cached_not_live(p)) return CUDA_ERROR_INVALID_VALUE;
  const RealDriver* d = real_driver();
  return d->cuMemHostGetDevicePointer_v2 ? d->cuMemHostGetDevicePointer_v2(out, p, flags) : CUDA_ERROR_NOT_FOUND;
}

}  // namespace cachalloc::shim
