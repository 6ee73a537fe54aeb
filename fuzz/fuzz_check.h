// fuzz_check.h — the fuzz targets' assertion: a failed property prints what
// failed and aborts, which libFuzzer reports as a crash and saves the input.
// (assert() would vanish under -DNDEBUG; this never does.)
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);    \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
