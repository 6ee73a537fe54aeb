// debug_assert.h — CACHALLOC_ASSERT: the core's run-time checks, on in
// debug builds only (meson -Dcachalloc_debug=true defines CACHALLOC_DEBUG=1;
// scripts/test.sh's asan phase builds that way).
//
// validate() checks every invariant after the fact, when a test calls it;
// these check one precondition at the moment it must hold, so a broken
// transition fails where it happens rather than operations later.  A
// failure prints the condition, what it means and file:line to stderr and
// aborts: it never throws (the shim's entry points are extern "C").  In a
// release build the condition is not evaluated and no code is emitted.
#pragma once

#if CACHALLOC_DEBUG
#include <cstdio>
#include <cstdlib>

namespace cachalloc::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void assert_failed(const char* cond, const char* what,
                                                                 const char* file, int line) {
  std::fprintf(stderr, "cachalloc: assertion failed: %s [%s] at %s:%d\n", what, cond, file, line);
  std::abort();
}

}  // namespace cachalloc::detail

#define CACHALLOC_ASSERT(cond, what) \
  ((cond) ? static_cast<void>(0) : ::cachalloc::detail::assert_failed(#cond, what, __FILE__, __LINE__))
#else
// (sizeof: the operands count as used, so a variable read only here draws
// no warning, and nothing is evaluated)
#define CACHALLOC_ASSERT(cond, what) static_cast<void>(sizeof((cond) ? 1 : 0))
#endif
