/* fake_faults.c — fault injection: chosen calls of chosen entry points fail.
 *
 * Two modes, both counted in failures_injected:
 *   chosen   fake_cuda_fail("cuMemMap", after, count, error): the after+1-th
 *            call of cuMemMap from now on and the count-1 following fail
 *            with `error` (count < 0: every call until reset).
 *   random   FAKE_CUDA_FAIL_RANDOM=<seed>:<per-mille>:<call,call,...>[:<error>]
 *            in the environment (read at the first call that can fail) or
 *            fake_cuda_fail_random(spec): each call of a listed entry point
 *            fails with that probability.  Whether the n-th call of an entry
 *            point fails depends only on the seed, the entry point and n, so
 *            a run is reproducible whatever other threads do.
 * Without an error (CUDA_SUCCESS, or no fourth field) each entry point fails
 * with a plausible error of its own (points[] below).  A faulted call
 * returns before it looks at anything: it changes nothing in the fake, not
 * even its own call counter (event_record, mem_alloc_failed, ...).
 * fake_cuda_fail_reset() stops both modes; fake_cuda_injected(error) says
 * how many calls failed with `error` so far (a test can check that every
 * error it saw was injected). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_state.h"

/* Names as fake_cuda_fail takes them; the _ptsz variants (and
 * cuStreamCreateWithPriority) share their base name's point. */
static const struct { const char* name; CUresult error; } points[FAULT_POINTS] = {
  [FAULT_MEM_ALLOC] = {"cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_MEM_ALLOC_ASYNC] = {"cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_EVENT_CREATE] = {"cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_EVENT_RECORD] = {"cuEventRecord", CUDA_ERROR_UNKNOWN},
  [FAULT_EVENT_QUERY] = {"cuEventQuery", CUDA_ERROR_UNKNOWN},
  [FAULT_EVENT_SYNCHRONIZE] = {"cuEventSynchronize", CUDA_ERROR_UNKNOWN},
  [FAULT_CTX_SYNCHRONIZE] = {"cuCtxSynchronize", CUDA_ERROR_UNKNOWN},
  [FAULT_STREAM_CREATE] = {"cuStreamCreate", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_STREAM_QUERY] = {"cuStreamQuery", CUDA_ERROR_UNKNOWN},
  [FAULT_MEM_CREATE] = {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_MEM_MAP] = {"cuMemMap", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_MEM_SET_ACCESS] = {"cuMemSetAccess", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_MEM_ADDRESS_RESERVE] = {"cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_MEM_HOST_ALLOC] = {"cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY},
  [FAULT_CTX_WAIT_EVENT] = {"cuCtxWaitEvent", CUDA_ERROR_UNKNOWN},
};

/* Chosen mode, per point: calls to let through, then calls to fail. */
static struct { long skip, fail; CUresult error; } chosen[FAULT_POINTS];

static struct {
  int on;
  unsigned long long seed;
  unsigned permille;
  CUresult error;                        /* 0: each point's own */
  int listed[FAULT_POINTS];
  unsigned long long calls[FAULT_POINTS]; /* since armed */
} random_mode;

/* Injections per error code (a handful of distinct codes in any test). */
#define MAX_CODES 32
static struct { CUresult error; unsigned long count; } injected[MAX_CODES];

static int find_point(const char* name, size_t len) {
  for (int i = 0; i < FAULT_POINTS; ++i)
    if (strlen(points[i].name) == len && strncmp(points[i].name, name, len) == 0) return i;
  return -1;
}

static void note_injected(CUresult error) {
  fake.stats.failures_injected++;
  for (int i = 0; i < MAX_CODES; ++i) {
    if (injected[i].count != 0 && injected[i].error != error) continue;
    injected[i].error = error;
    injected[i].count++;
    return;
  }
}

/* splitmix64's finalizer. */
static unsigned long long mix(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Parses "<seed>:<per-mille>:<call,call,...>[:<error>]" into random_mode
 * and arms it; -1 (nothing changed) when malformed (lock held). */
static int arm_random(const char* spec) {
  char* end;
  unsigned long long seed = strtoull(spec, &end, 10);
  if (end == spec || *end != ':') return -1;
  const char* at = end + 1;
  unsigned long permille = strtoul(at, &end, 10);
  if (end == at || *end != ':' || permille > 1000) return -1;
  int listed[FAULT_POINTS] = {0};
  at = end + 1;
  for (;;) {
    size_t len = strcspn(at, ",:");
    int p = find_point(at, len);
    if (p < 0) return -1;
    listed[p] = 1;
    at += len;
    if (*at != ',') break;
    ++at;
  }
  long error = 0;
  if (*at == ':') {
    error = strtol(at + 1, &end, 10);
    if (end == at + 1 || *end != 0 || error <= 0) return -1;
  } else if (*at != 0) {
    return -1;
  }
  memset(&random_mode, 0, sizeof random_mode);
  random_mode.on = 1;
  random_mode.seed = seed;
  random_mode.permille = (unsigned)permille;
  random_mode.error = (CUresult)error;
  memcpy(random_mode.listed, listed, sizeof listed);
  return 0;
}

static void read_environment(void) {
  static int done;
  if (done) return;
  done = 1;
  const char* spec = getenv("FAKE_CUDA_FAIL_RANDOM");
  if (spec == NULL || *spec == 0 || arm_random(spec) == 0) return;
  fprintf(stderr, "fake libcuda: malformed FAKE_CUDA_FAIL_RANDOM=%s (seed:per-mille:call,call,...[:error])\n", spec);
  abort();
}

CUresult fake_fault(enum fake_fault_point point) {
  read_environment();
  CUresult error = CUDA_SUCCESS;
  if (chosen[point].fail != 0) {
    if (chosen[point].skip > 0) {
      chosen[point].skip--;
    } else {
      error = chosen[point].error;
      if (chosen[point].fail > 0) chosen[point].fail--;
    }
  }
  if (random_mode.on && random_mode.listed[point]) {
    const unsigned long long n = random_mode.calls[point]++;
    const unsigned long long draw = mix(random_mode.seed ^ mix(((unsigned long long)point << 40) + n));
    if (error == CUDA_SUCCESS && draw % 1000 < random_mode.permille)
      error = random_mode.error != CUDA_SUCCESS ? random_mode.error : points[point].error;
  }
  if (error != CUDA_SUCCESS) note_injected(error);
  return error;
}

/* ---------------- test controls ---------------- */

EXPORT void fake_cuda_fail(const char* call, int after, int count, CUresult error) {
  int p = call != NULL ? find_point(call, strlen(call)) : -1;
  if (p < 0) {
    fprintf(stderr, "fake libcuda: fake_cuda_fail: no fault point named %s\n", call ? call : "(null)");
    abort();
  }
  fake_lock();
  chosen[p].skip = after > 0 ? after : 0;
  chosen[p].fail = count;
  chosen[p].error = error != CUDA_SUCCESS ? error : points[p].error;
  fake_unlock();
}

EXPORT int fake_cuda_fail_random(const char* spec) {
  fake_lock();
  read_environment();
  int r = 0;
  if (spec == NULL || *spec == 0) random_mode.on = 0;
  else r = arm_random(spec);
  fake_unlock();
  return r;
}

EXPORT void fake_cuda_fail_reset(void) {
  fake_lock();
  read_environment(); /* a later first call must not arm it again */
  memset(chosen, 0, sizeof chosen);
  random_mode.on = 0;
  fake_unlock();
}

EXPORT unsigned long fake_cuda_injected(CUresult error) {
  unsigned long n = 0;
  fake_lock();
  for (int i = 0; i < MAX_CODES; ++i)
    if (injected[i].count != 0 && injected[i].error == error) n = injected[i].count;
  fake_unlock();
  return n;
}
