// context_ops.h — calls that end a context or join two.
//
// Destruction: cuCtxDestroy (and the old cuCtxDetach), cuDevicePrimaryCtxReset (what cudaDeviceReset
// calls) and cuDevicePrimaryCtxRelease when it drops the last reference
// free every allocation, event and stream of the context.  After the real
// call succeeded, forget_context() retires the context's cache (see
// context_registry.h): nothing touches the dead context again, and the next
// allocation in a context with the same handle value (the primary context
// keeps its handle across a reset) starts from a fresh cache.
//
// Peer access: cuCtxEnablePeerAccess covers cuMemAlloc memory, not
// cuMemMap'ed pages, so expandable segments grant the peer device access to
// their pages themselves (now and for pages mapped later); disabling
// revokes it.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

// `real` is the driver's cuCtxDestroy_v2, cuCtxDestroy (before 4.0) or cuCtxDetach.
CUresult do_ctx_destroy(CUcontext ctx, CUresult (*real)(CUcontext));
// `v2` picks the _v2 or the 7.0 entry point of the driver (same semantics).
CUresult do_primary_ctx_reset(CUdevice device, bool v2);
CUresult do_primary_ctx_release(CUdevice device, bool v2);
CUresult do_ctx_enable_peer_access(CUcontext peer, unsigned int flags);
CUresult do_ctx_disable_peer_access(CUcontext peer);

}  // namespace cachalloc::shim
