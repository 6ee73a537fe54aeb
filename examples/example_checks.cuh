// example_checks.cuh — how the examples report failures: fail() counts one
// and prints a "    FAIL: ..." line (only the first `max_printed`, when
// a stress loop could print thousands), CK() checks a CUDA call and fails
// with its name, line and error; MUST() is for set-up calls a program
// cannot go on without: it prints the call, its place and the error, and
// exits.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace examples {

inline std::atomic<int> g_failures{0};
inline int g_max_printed = 1 << 30;

inline void fail(const char* fmt, ...) {
  if (g_failures.fetch_add(1) >= g_max_printed) return;
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("    FAIL: ", stdout);
  std::vprintf(fmt, ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  va_end(ap);
}

inline bool ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return true;
  fail("line %d: %s -> %s", line, what, cudaGetErrorName(e));
  return false;
}

inline void must(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
  std::exit(1);
}

}  // namespace examples

#define CK(call) examples::ok((call), #call, __LINE__)
#define MUST(call) examples::must((call), #call, __FILE__, __LINE__)
