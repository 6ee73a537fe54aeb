// guarded.h — runs an exported entry point's body with no exception
// crossing into the C program: any exception becomes CUDA_ERROR_UNKNOWN.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

template <typename Body>
CUresult guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cachalloc::shim
