/* check.h — the assertion macros of the test programs that need nothing
 * more (integration/pluggable.c, integration/runtime_api.c,
 * stress/control_api.c): a failed check prints file, line and the condition
 * on stderr and returns 1 from the calling function (a case's failure).
 * Programs that say more (a route, a mode) define their own.
 *
 * CHECK_CU needs <cuda.h> (CUDA_SUCCESS) where it is used. */
#ifndef CACHALLOC_TESTS_CHECK_H
#define CACHALLOC_TESTS_CHECK_H

#include <stdio.h>

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)
/* `call` must return `want` (ints: cachalloc's and the driver's codes). */
#define CHECK_RC(call, want)                                                                           \
  do {                                                                                                 \
    int rc_ = (call);                                                                                  \
    if (rc_ != (want)) {                                                                               \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, rc_, (want)); \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

#endif
