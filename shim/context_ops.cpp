// context_ops.cpp — context destruction and peer access.
#include "context_ops.h"

#include "context_registry.h"
#include "process_state.h"
#include "start_up.h"

namespace cachalloc::shim {
namespace {

const RealDriver* driver() { return real_driver(); }

// Bookkeeping is only kept while serving; in a forked child or after exit
// began the calls go to the driver alone.
bool tracking() { return serving(current_mode()); }

// The primary context of `device` if it is active (nullptr otherwise),
// found without creating it: a retain/release pair on an active primary
// context changes nothing.
CUcontext active_primary(CUdevice device) {
  const RealDriver* d = driver();
  if (d->cuDevicePrimaryCtxGetState == nullptr || d->cuDevicePrimaryCtxRetain == nullptr ||
      d->cuDevicePrimaryCtxRelease_v2 == nullptr)
    return nullptr;
  unsigned int flags = 0;
  int active = 0;
  if (d->cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active == 0) return nullptr;
  CUcontext ctx = nullptr;
  if (d->cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS) return nullptr;
  d->cuDevicePrimaryCtxRelease_v2(device);
  return ctx;
}

bool primary_active(CUdevice device) {
  unsigned int flags = 0;
  int active = 1;
  const RealDriver* d = driver();
  return d->cuDevicePrimaryCtxGetState == nullptr ||
         d->cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active != 0;
}

// Runs `real`, a reset or a release of `device`'s primary context, and
// retires the primary's cache when the call destroyed it: a reset always
// does, a release only when it dropped the last reference.
CUresult end_primary(CUdevice device, CUresult (*real)(CUdevice), bool always_destroys) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUcontext primary = tracking() ? active_primary(device) : nullptr;
  const CUresult r = real(device);
  if (r == CUDA_SUCCESS && primary != nullptr && (always_destroys || !primary_active(device))) forget_context(primary);
  return r;
}

// The calling thread's current context and its device.
bool current_context(CUcontext* ctx, int* device) {
  CUdevice dev = 0;
  if (driver()->cuCtxGetCurrent(ctx) != CUDA_SUCCESS || *ctx == nullptr) return false;
  if (driver()->cuCtxGetDevice(&dev) != CUDA_SUCCESS) return false;
  *device = dev;
  return true;
}

}  // namespace

CUresult do_ctx_destroy(CUcontext ctx, CUresult (*real)(CUcontext)) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = real(ctx);
  if (r == CUDA_SUCCESS && tracking()) forget_context(ctx);
  return r;
}

CUresult do_primary_ctx_reset(CUdevice device, bool v2) {
  const RealDriver* d = driver();
  return end_primary(device, v2 ? d->cuDevicePrimaryCtxReset_v2 : d->cuDevicePrimaryCtxReset, true);
}

CUresult do_primary_ctx_release(CUdevice device, bool v2) {
  const RealDriver* d = driver();
  return end_primary(device, v2 ? d->cuDevicePrimaryCtxRelease_v2 : d->cuDevicePrimaryCtxRelease, false);
}

CUresult do_ctx_enable_peer_access(CUcontext peer, unsigned int flags) {
  const CUresult r = driver()->cuCtxEnablePeerAccess(peer, flags);
  CUcontext self = nullptr;
  int device = 0;
  if (r == CUDA_SUCCESS && tracking() && current_context(&self, &device)) peer_access_enabled(self, device, peer);
  return r;
}

CUresult do_ctx_disable_peer_access(CUcontext peer) {
  const CUresult r = driver()->cuCtxDisablePeerAccess(peer);
  CUcontext self = nullptr;
  int device = 0;
  if (r == CUDA_SUCCESS && tracking() && current_context(&self, &device)) peer_access_disabled(self, device, peer);
  return r;
}

}  // namespace cachalloc::shim
