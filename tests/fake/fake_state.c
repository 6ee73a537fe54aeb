/* fake_state.c — the fake libcuda.so.1's global state and what every file uses.
 *
 * Built as tests/fake/libcuda.so.1 together with the other fake_*.c files
 * (fake_state.h lists them).  Device memory is host memory counted against
 * a configurable total (FAKE_CUDA_TOTAL_MB, default 1024) so that
 * out-of-memory can be provoked; FAKE_CUDA_DEVICES (1..4, default 1) sets
 * the number of devices.  Streams, events and contexts are small host
 * structs.  Completion of GPU work is scripted: a stream the test holds
 * busy (fake_cuda_hold_stream) leaves every event recorded on it incomplete
 * until released or synchronized.
 *
 * Where the real driver's behaviour was measured (H100, driver 580, CUDA 13)
 * the fake copies it: address ranges and pointer attributes, the IPC
 * handle's layout and open/close reference rules, context destruction (a
 * primary context keeps its handle and gets a new generation when it
 * restarts), peer access.  Calls that name objects of a destroyed context
 * fail and are counted (dead_context_calls): a real driver may crash there.
 * Every entry point takes one global lock: tests are small, clarity wins. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/resource.h>

#include "fake_state.h"

struct fake_driver fake = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .device_count = 1,
  .next_buffer_id = FIRST_BUFFER_ID,
  .legacy_stream = {.blocking = 1},
};
__thread CUcontext fake_current;
unsigned long fake_ctx_set_current_calls;
static __thread struct CUstream_st* t_thread_stream;

/* Pushed with a compare-and-swap, so that it needs no lock (callers may or
 * may not hold fake.lock); readers load the head with acquire. */
struct CUstream_st* fake_thread_stream(void) {
  if (t_thread_stream == NULL) {
    struct CUstream_st* s = calloc(1, sizeof *s);
    s->blocking = 1;
    s->thread_next = __atomic_load_n(&fake.thread_streams, __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(&fake.thread_streams, &s->thread_next, s, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE)) {
    }
    t_thread_stream = s;
  }
  return t_thread_stream;
}

struct CUstream_st* fake_first_thread_stream(void) { return __atomic_load_n(&fake.thread_streams, __ATOMIC_ACQUIRE); }

void fake_lock(void) { pthread_mutex_lock(&fake.lock); }
void fake_unlock(void) { pthread_mutex_unlock(&fake.lock); }

size_t fake_env_size(const char* name, size_t def) {
  const char* v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 10) : def;
}

size_t fake_round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* An fd per live allocation: lift the soft limit so that tests with many
 * live allocations do not run out. */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= 65536 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
  setrlimit(RLIMIT_NOFILE, &rl);
}

void fake_init_once(void) {
  static int done;
  if (done) return;
  done = 1;
  fake.stats.total_bytes = fake_env_size("FAKE_CUDA_TOTAL_MB", 1024) << 20;
  fake.device_count = (int)fake_env_size("FAKE_CUDA_DEVICES", 1);
  if (fake.device_count < 1 || fake.device_count > MAX_DEVICES) fake.device_count = 1;
  for (int i = 0; i < MAX_DEVICES; ++i) {
    fake.primary[i].device = i;
    fake.primary[i].primary = 1;
  }
  raise_fd_limit();
}

/* Maps a stream handle as the driver would: 0 is the default stream of the
 * calling convention (legacy, or per-thread for _ptsz entry points). */
struct CUstream_st* fake_resolve_stream(CUstream s, int ptsz) {
  if (s == NULL) return ptsz ? fake_thread_stream() : &fake.legacy_stream;
  if (s == CU_STREAM_LEGACY) return &fake.legacy_stream;
  if (s == CU_STREAM_PER_THREAD) return fake_thread_stream();
  return s;
}

/* ---------------- context liveness ---------------- */

int fake_ctx_live(const struct CUctx_st* c, unsigned generation) {
  return c == NULL || (c->alive && c->generation == generation);
}

CUresult fake_check_current(void) {
  if (fake_current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return fake_current->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

CUresult fake_dead_call(void) {
  fake.stats.dead_context_calls++;
  return CUDA_ERROR_CONTEXT_IS_DESTROYED;
}
