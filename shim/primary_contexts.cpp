// primary_contexts.cpp — the primary contexts the pluggable ABI serves in,
// their reset check, and the run-time memory fraction (primary_contexts.h).
#include "primary_contexts.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "context_registry.h"
#include "log.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"

namespace cachalloc::shim {
namespace {

// --- run-time memory fraction ----------------------------------------------------

std::array<std::atomic<double>, kMaxFractionDevices> g_fraction{};

// --- primary contexts --------------------------------------------------------------

using DeviceGetFn = CUresult (*)(CUdevice*, int);
using InitDriverFn = CUresult (*)(unsigned int);

// Device ordinal `i`'s primary context as the pluggable ABI uses it.
struct Primary {
  std::atomic<CUcontext> ctx{nullptr};
  // cuCtxGetId of ctx when it was (re)retained: which context the cache was
  // made in.  0 when the driver has no cuCtxGetId (before CUDA 12.0).
  std::atomic<unsigned long long> id{0};
  CUdevice dev = 0;  // written before ctx is published
};
std::array<Primary, kMaxFractionDevices> g_primary{};
std::mutex g_primary_mutex;

// The unique id of live context `ctx` (cuCtxGetId: "unique for the life of
// the program"), or 0 when the driver has no such call or refuses.
unsigned long long context_id(const RealDriver* d, CUcontext ctx) {
  unsigned long long id = 0;
  if (d->cuCtxGetId == nullptr || d->cuCtxGetId(ctx, &id) != CUDA_SUCCESS) return 0;
  return id;
}

// The primary context of device ordinal `device`, retained once for the
// life of the process (as cudart does); nullptr when the driver refuses.
CUcontext primary_context(const RealDriver* d, int device) {
  if (device < 0 || device >= kMaxFractionDevices) return nullptr;
  Primary& p = g_primary[device];
  CUcontext ctx = p.ctx.load(std::memory_order_acquire);
  if (ctx != nullptr) [[likely]] return ctx;
  std::lock_guard lock(g_primary_mutex);
  ctx = p.ctx.load(std::memory_order_relaxed);
  if (ctx != nullptr) return ctx;
  auto device_get = reinterpret_cast<DeviceGetFn>(real_dlsym(d->handle, "cuDeviceGet"));
  auto init = reinterpret_cast<InitDriverFn>(real_dlsym(d->handle, "cuInit"));
  if (device_get == nullptr || d->cuDevicePrimaryCtxRetain == nullptr) return nullptr;
  CUdevice dev = 0;
  CUresult r = device_get(&dev, device);
  if (r == CUDA_ERROR_NOT_INITIALIZED && init != nullptr && init(0) == CUDA_SUCCESS) r = device_get(&dev, device);
  if (r != CUDA_SUCCESS || d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || ctx == nullptr) {
    obs::logger().error("cachalloc_malloc/cachalloc_free: no primary context for device {} (error {})", device,
                        static_cast<int>(r));
    return nullptr;
  }
  p.dev = dev;
  p.id.store(context_id(d, ctx), std::memory_order_relaxed);
  p.ctx.store(ctx, std::memory_order_release);
  return ctx;
}

// --- primary context resets (passive mode) ---------------------------------------------
//
// Preloaded, the hooks on cuDevicePrimaryCtxReset/Release and cuCtxDestroy
// retire a context's cache when the driver destroys it (context_ops.h).
// Dlopen'ed, nothing reaches those hooks, so every pluggable call first
// asks the driver whether the primary context is still the one its cache
// was made in: cuCtxGetId, whose value is unique per context for the life of
// the process.  A reset leaves the handle as it was (measured) but ends the
// context: afterwards cuCtxGetId fails (until the primary is retained
// again) or gives another id (once cudart or anyone retained it again).
// Either way the cache is retired as the hooks would (forget_context: no
// driver call for the dead context's segments, events or streams) with one
// warning, the blocks the program still held become orphans (their frees
// are dropped: the memory died with the context), and an allocation retains
// the primary again (what cudart does after cudaDeviceReset) and serves
// from a fresh cache.  Without cuCtxGetId (driver before 12.0) the check is
// cuDevicePrimaryCtxGetState's "inactive", which misses a reset after which
// something else retained the primary before cachalloc's next call.

// Live blocks of destroyed contexts that the program has not freed yet.
std::mutex g_orphan_mutex;
std::atomic<std::size_t> g_orphan_count{0};
std::unordered_set<DevicePtr>& orphans() {
  static auto* s = new std::unordered_set<DevicePtr>();  // leaked, as deferred_frees()
  return *s;
}

void adopt_orphans(const std::vector<DevicePtr>& live) {
  std::lock_guard lock(g_orphan_mutex);
  orphans().insert(live.begin(), live.end());
  g_orphan_count.store(orphans().size(), std::memory_order_relaxed);
}

// Retires the cache of `ctx` (destroyed), says so once, and keeps its live
// blocks as orphans.  `now` describes what the primary is now, for the warning.
void retire_destroyed(CUcontext ctx, int device, unsigned long long old_id, const std::string& now) {
  ContextState* s = forget_context(ctx, false);
  if (s == nullptr) return;  // no cache, or retired already
  const std::vector<DevicePtr> live = s->allocator().live_block_addresses();
  const auto reserved = s->allocator().stats().reserved_bytes[StatType::aggregate].current;
  adopt_orphans(live);
  obs::logger().warn("the primary context of device {} was destroyed behind cachalloc's back (cudaDeviceReset, "
                     "cuDevicePrimaryCtxReset or its last release; context id {} {}): its cache ({} bytes reserved) "
                     "is dropped without touching the dead memory, the {} block(s) still allocated in it died with "
                     "it (their frees are ignored), and allocations come from a fresh cache",
                     device, old_id, now, reserved, live.size());
}

// The slow path of live_primary(): the check failed.  Under the lock, checks
// again, retires the old cache, and (when `activate`, or the primary was
// made active again by someone else) retains the primary again and
// remembers its new id.  nullptr when the primary is not usable (a free
// after a reset with the primary still inactive: it is not revived for a free).
CUcontext primary_changed(const RealDriver* d, int device, bool activate) {
  std::lock_guard lock(g_primary_mutex);
  Primary& p = g_primary[device];
  const CUcontext ctx = p.ctx.load(std::memory_order_relaxed);
  const unsigned long long old_id = p.id.load(std::memory_order_relaxed);
  const unsigned long long id = context_id(d, ctx);  // 0: refused (destroyed) or no cuCtxGetId
  unsigned int flags = 0;
  int state = 0;
  const bool active = d->cuDevicePrimaryCtxGetState != nullptr
                          ? d->cuDevicePrimaryCtxGetState(p.dev, &flags, &state) == CUDA_SUCCESS && state != 0
                          : id != 0;
  if (d->cuCtxGetId != nullptr && id != 0) {
    if (id == old_id) return ctx;  // another thread got here first
    if (old_id == 0) {             // no id was known (refused at the retain): no evidence of a reset
      p.id.store(id, std::memory_order_release);
      return ctx;
    }
  } else if (active) {
    return ctx;  // no cuCtxGetId: only "inactive" tells
  }
  // The context the cache was made in is gone.
  if (!active && !activate) {
    retire_destroyed(ctx, device, old_id, "is inactive");
    return nullptr;
  }
  CUcontext fresh = nullptr;
  if (d->cuDevicePrimaryCtxRetain == nullptr || d->cuDevicePrimaryCtxRetain(&fresh, p.dev) != CUDA_SUCCESS ||
      fresh == nullptr) {
    retire_destroyed(ctx, device, old_id, "is inactive");
    obs::logger().error("cachalloc_malloc: cannot retain the primary context of device {} again", device);
    return nullptr;
  }
  const unsigned long long fresh_id = context_id(d, fresh);
  retire_destroyed(ctx, device, old_id, "is now " + std::to_string(fresh_id));
  p.id.store(fresh_id, std::memory_order_release);
  p.ctx.store(fresh, std::memory_order_release);
  return fresh;
}

}  // namespace

// Whether `ptr` was a live block of a destroyed context: its free then does
// nothing, as the driver's cuMemFree of memory that died with its context
// changes nothing.  Asked before the live caches, so that of two frees of
// one address (the dead block, and a new block at the same address) the
// live block is freed by the second: never while it may still be in use.
bool drop_orphan(void* ptr) {
  if (g_orphan_count.load(std::memory_order_relaxed) == 0) [[likely]] return false;
  std::lock_guard lock(g_orphan_mutex);
  if (orphans().erase(reinterpret_cast<DevicePtr>(ptr)) == 0) return false;
  g_orphan_count.store(orphans().size(), std::memory_order_relaxed);
  if (obs::logger().should_log(LogLevel::debug))
    obs::logger().debug("cachalloc_free({}): the block died with its context; nothing to free", ptr);
  return true;
}

// The primary context of `device` to serve in.  Passive, it is first
// checked against the context its cache was made in (see above): one
// cuCtxGetId per call.  Active, the hooks see resets: nothing more to do.
// `activate`: an allocation retains a primary found inactive again; a free
// does not (nullptr then, the cache retired).
CUcontext live_primary(const RealDriver* d, int device, Mode m, bool activate) {
  const CUcontext ctx = primary_context(d, device);
  if (ctx == nullptr || m != Mode::passive) return ctx;
  Primary& p = g_primary[device];
  if (d->cuCtxGetId != nullptr) {
    unsigned long long id = 0;
    if (d->cuCtxGetId(ctx, &id) == CUDA_SUCCESS && id == p.id.load(std::memory_order_acquire)) [[likely]]
      return ctx;
  } else {
    unsigned int flags = 0;
    int active = 0;
    if (d->cuDevicePrimaryCtxGetState == nullptr ||
        d->cuDevicePrimaryCtxGetState(p.dev, &flags, &active) != CUDA_SUCCESS || active != 0)
      return ctx;
  }
  return primary_changed(d, device, activate);
}

void check_primary_contexts() {
  const Mode m = current_mode();
  if (m != Mode::passive) return;
  const RealDriver* d = real_driver();
  if (d == nullptr) return;
  for (int i = 0; i < kMaxFractionDevices; ++i)
    if (g_primary[i].ctx.load(std::memory_order_acquire) != nullptr) (void)live_primary(d, i, m, false);
}

double memory_fraction_override(int device) {
  if (device < 0 || device >= kMaxFractionDevices) return 0.0;
  return g_fraction[device].load(std::memory_order_relaxed);
}

bool set_memory_fraction_override(int device, double fraction) {
  if (device < -1 || device >= kMaxFractionDevices) return false;
  for (int i = 0; i < kMaxFractionDevices; ++i)
    if (device == -1 || device == i) g_fraction[i].store(fraction, std::memory_order_relaxed);
  return true;
}

}  // namespace cachalloc::shim
