// fresh_pinned.h — page-locked host memory for pause backups, faster than
// cuMemHostAlloc for large buffers (fresh_pinned.cpp says how and why).
#pragma once

#include <cstddef>

#include "real_driver.h"

namespace cachalloc::shim {

// `size` bytes of page-locked host memory for the current context, in *out.
// CUDA_SUCCESS, or the driver's error; cuMemHostAlloc's for buffers up to
// 128 MiB and wherever registration is not possible.  Never throws.
CUresult fresh_pinned_alloc(const RealDriver* d, std::size_t size, void** out);
// Gives back what fresh_pinned_alloc returned.
void fresh_pinned_free(const RealDriver* d, void* ptr);

}  // namespace cachalloc::shim
