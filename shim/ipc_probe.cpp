// ipc_probe.cpp — the once-per-process proof of the IPC handle layout.
#include "ipc_probe.h"

#include <array>
#include <atomic>
#include <mutex>

#include "capture_tracking.h"
#include "context_registry.h"
#include "ipc_layout.h"
#include "log.h"

namespace cachalloc::shim {
namespace {

// Distinct, no multiples of 512 (the driver's placement unit), together far
// below one 2 MiB mapping.
constexpr std::array<std::size_t, 3> kProbeSizes = {200, 700, 1300};

enum State : int { kUnknown, kProven, kUnproven };
std::atomic<int> g_state{kUnknown};
std::mutex g_probe_mutex;

// What the driver says of its allocation at s->ptr.
CUresult describe(const RealDriver* d, IpcProbeSample* s) {
  CUresult r = d->cuMemGetAddressRange_v2(&s->range_base, &s->range_size, s->ptr);
  if (r != CUDA_SUCCESS) return r;
  // Optional (CUDA 11.x drivers may not know the attribute): rule 3 of
  // ipc_layout.h still proves the layout without it.
  s->mapping_known =
      d->cuPointerGetAttribute(&s->mapping_base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, s->ptr) == CUDA_SUCCESS;
  return d->cuIpcGetMemHandle(&s->handle, s->ptr);
}

// Allocates, describes and frees the probe allocations.
CUresult take_samples(const RealDriver* d, std::array<IpcProbeSample, kProbeSizes.size()>* samples) {
  std::size_t made = 0;
  CUresult r = CUDA_SUCCESS;
  for (; made < kProbeSizes.size(); ++made) {
    r = d->cuMemAlloc_v2(&(*samples)[made].ptr, kProbeSizes[made]);
    if (r != CUDA_SUCCESS) break;
  }
  for (std::size_t i = 0; i < made && r == CUDA_SUCCESS; ++i) r = describe(d, &(*samples)[i]);
  for (std::size_t i = 0; i < made; ++i) d->cuMemFree_v2((*samples)[i].ptr);
  return r;
}

CUresult probe(const RealDriver* d, CUcontext ctx) {
  std::array<IpcProbeSample, kProbeSizes.size()> samples{};
  CUresult r;
  {
    ContextGuard guard(d, ctx);
    r = take_samples(d, &samples);
  }
  if (r == CUDA_ERROR_NOT_SUPPORTED) {  // no IPC on this platform: a verdict too
    obs::logger().error("cuIpcGetMemHandle: the driver refuses IPC for its own small allocations "
                        "(CUDA_ERROR_NOT_SUPPORTED), so this driver's IPC handle layout cannot be proven");
    g_state.store(kUnproven, std::memory_order_release);
    return r;
  }
  if (r != CUDA_SUCCESS) {
    obs::logger().warn("cuIpcGetMemHandle: the probe of the IPC handle layout failed (CUresult {}); retrying at the "
                       "next export",
                       static_cast<int>(r));
    return r;
  }
  const IpcLayoutVerdict v = judge_ipc_layout(samples);
  if (v.layout == IpcLayout::kProven) {
    obs::logger().info("cuIpcGetMemHandle: IPC handle layout proven (size at bytes {}-{}, offset at bytes {}-{})",
                       IpcHandleFields::kSizeOffset, IpcHandleFields::kSizeOffset + 7, IpcHandleFields::kOffsetOffset,
                       IpcHandleFields::kOffsetOffset + 3);
    g_state.store(kProven, std::memory_order_release);
    return CUDA_SUCCESS;
  }
  obs::logger().error(
      "cuIpcGetMemHandle: this driver's IPC handle layout is {}: {}; a block that is not a whole segment will not "
      "be exported (CUDA_ERROR_NOT_SUPPORTED) rather than risk a handle of the wrong memory",
      v.layout == IpcLayout::kRefuted ? "not the one cachalloc knows" : "unproven", v.reason);
  g_state.store(kUnproven, std::memory_order_release);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult from_state(int s) { return s == kProven ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED; }

}  // namespace

CUresult ensure_ipc_layout_proven(const RealDriver* d, CUcontext ctx) {
  const int s = g_state.load(std::memory_order_acquire);
  if (s != kUnknown) [[likely]] return from_state(s);
  // The probe's cuMemAlloc would invalidate a global or thread-local capture
  // the program has in flight: wait for it to end.
  if (strict_capture_in_flight()) {
    obs::logger().warn("cuIpcGetMemHandle: the IPC handle layout is proven by a probe that allocates, which a "
                       "stream capture in progress forbids; export again after the capture");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  std::lock_guard lock(g_probe_mutex);
  const int again = g_state.load(std::memory_order_acquire);
  if (again != kUnknown) return from_state(again);
  return probe(d, ctx);
}

}  // namespace cachalloc::shim
