// ipc_probe.h — proving the IPC handle layout once per process.
//
// Before cachalloc first rewrites a handle (ipc_ops.h), it makes three
// small allocations through the real driver (200, 700 and 1300 bytes,
// which it sub-allocates in its shared 2 MiB mappings), asks the driver what
// they are (cuMemGetAddressRange, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
// cuIpcGetMemHandle), frees them and judges the layout (ipc_layout.h).  The
// verdict holds for the process: the layout is the driver's, not a
// device's.  Cost, once: six small driver calls and the 2 MiB mapping the
// driver may keep for its small allocations.
#pragma once

#include "cuda_api.h"
#include "real_driver.h"

namespace cachalloc::shim {

// CUDA_SUCCESS: the layout is proven.  CUDA_ERROR_NOT_SUPPORTED: it was
// refuted or cannot be proven on this driver; the reason is logged once, as
// an error.  Both are kept for the process.  Any other error: a driver call
// of the probe failed (out of memory, say), or a global or thread-local
// stream capture is in flight (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: the
// probe's allocation would invalidate it); nothing is kept, and the next
// export tries again.  The probe runs in `ctx` (made current meanwhile);
// concurrent callers wait for one probe.
CUresult ensure_ipc_layout_proven(const RealDriver* d, CUcontext ctx);

}  // namespace cachalloc::shim
