// guarded.h — runs an exported entry point's body with no exception
// crossing into the C program.  The shim's one guard: the driver and
// runtime hooks, the control and pause APIs and the pluggable ABI each pass
// the answer their callers understand for a failure.
#pragma once

#include <new>
#include <utility>

#include "cuda_api.h"

namespace cachalloc::shim {

// `body()`, or `on_error` when it throws (`on_bad_alloc` for std::bad_alloc).
template <typename R, typename Body>
R guarded(R on_error, R on_bad_alloc, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return on_bad_alloc;
  } catch (...) {
    return on_error;
  }
}

// `body()`, or `on_error` when it throws anything.
template <typename R, typename Body>
R guarded(R on_error, Body&& body) noexcept {
  return guarded(on_error, on_error, std::forward<Body>(body));
}

// The driver hooks: any exception becomes CUDA_ERROR_UNKNOWN.
template <typename Body>
CUresult guarded(Body&& body) noexcept {
  return guarded(CUDA_ERROR_UNKNOWN, std::forward<Body>(body));
}

}  // namespace cachalloc::shim
