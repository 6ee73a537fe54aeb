/* fake_contexts.c — init, devices, contexts, primary contexts, peer access.
 *
 * A primary context's handle is always &fake.primary[d]; it starts again
 * with a new generation (and so a new cuCtxGetId) after its last release
 * or a reset, as the real driver's does, so objects made before show as
 * stale.  Destroying a
 * context frees its cuMemAlloc memory, IPC imports and page-locked host
 * memory (assumed, not measured), and its streams and
 * events die with it; cuMemCreate memory, mappings and reservations outlive
 * it (measured on an H100). */
#include <stdlib.h>

#include "fake_state.h"

/* ---------------- context lifetime ---------------- */

/* Frees everything the context owns; its events die with its generation. */
static void destroy_context(struct CUctx_st* c) {
  c->alive = 0;
  c->refcount = 0;
  c->npeers = 0;
  for (size_t i = fake.nallocs; i-- > 0;)
    if (fake.allocs[i].ctx == c) fake_free_allocation(i);
  fake_drop_imports_of(c);
  fake_drop_host_of(c);
  fake_kill_streams_of(c);
  fake_forget_events_of(c);
  /* cuMemCreate memory, its mappings and address reservations are not
   * context memory (cuda.h: "cuCtxDestroy() will not destroy memory
   * allocations by cuMemCreate()"; measured on an H100): they outlive the
   * context and must be released explicitly. */
  fake.stats.ctx_destroyed++;
}

static void start_context(struct CUctx_st* c) {
  c->alive = 1;
  c->generation = ++fake.generations;
  c->npeers = 0;
  c->nwaits = 0;
}

/* ---------------- init, devices ---------------- */

EXPORT CUresult cuInit(unsigned int flags) {
  (void)flags;
  fake_lock();
  fake_init_once();
  fake.initialized = 1;
  fake_unlock();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
  if (!fake.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = fake.device_count;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!fake.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  fake_init_once();
  *bytes = fake.stats.total_bytes;
  fake_unlock();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 1; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

/* ---------------- primary contexts ---------------- */

/* The handle is always &primary[d]; an inactive primary starts again with
 * a new generation, as the real driver's does. */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (!fake.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  struct CUctx_st* c = &fake.primary[d];
  if (!c->alive) start_context(c);
  c->refcount++;
  fake_unlock();
  *ctx = c;
  return CUDA_SUCCESS;
}

/* The last release destroys the primary context. */
static CUresult release_primary(CUdevice d) {
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  struct CUctx_st* c = &fake.primary[d];
  CUresult r = c->refcount > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (r == CUDA_SUCCESS && --c->refcount == 0) destroy_context(c);
  fake_unlock();
  return r;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return release_primary(d); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return release_primary(d); }

/* Destroys the primary context whatever its reference count.  Threads that
 * had it current keep the handle (calls then fail with 709). */
static CUresult reset_primary(CUdevice d) {
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  if (fake.primary[d].alive) destroy_context(&fake.primary[d]);
  fake_unlock();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return reset_primary(d); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return reset_primary(d); }

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  *flags = 0;
  *active = fake.primary[d].alive;
  fake_unlock();
  return CUDA_SUCCESS;
}

/* ---------------- the current context ---------------- */

EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = fake_current;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  __atomic_fetch_add(&fake_ctx_set_current_calls, 1, __ATOMIC_RELAXED);
  fake_current = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  fake_lock();
  CUresult r = fake_check_current();
  if (r == CUDA_SUCCESS) *d = fake_current->device;
  fake_unlock();
  return r;
}

/* The context's unique id is its generation (a process-wide counter, new
 * each time a context starts), so a primary context gets a new id after a
 * reset or its last release, once retained again, under the same handle.
 * A destroyed context has none: CUDA_ERROR_CONTEXT_IS_DESTROYED (a primary
 * context between its reset and the next retain; a created one after
 * cuCtxDestroy).  Not counted as a dead-context call: it names the
 * handle, which the fake keeps, not an object of the dead context. */
EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (id == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == NULL) ctx = fake_current;
  if (ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  fake_lock();
  CUresult r = ctx->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (r == CUDA_SUCCESS) *id = ctx->generation;
  fake_unlock();
  return r;
}

/* ---------------- created contexts ---------------- */

static CUresult create_context(CUcontext* out, CUdevice d) {
  if (!fake.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st* c = calloc(1, sizeof *c);
  c->device = d;
  fake_lock();
  start_context(c);
  fake_unlock();
  fake_current = c;
  *out = c;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext* out, unsigned int flags, CUdevice d) {
  (void)flags;
  return create_context(out, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext* out, CUctxCreateParams* params, unsigned int flags, CUdevice d) {
  (void)params;
  (void)flags;
  return create_context(out, d);
}

/* Created contexts only (a primary one is CUDA_ERROR_INVALID_CONTEXT).  The
 * struct is never freed: stale handles stay recognizable. */
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (ctx->primary) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (!ctx->alive) { /* destroyed twice */
    fake_dead_call();
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    destroy_context(ctx);
  }
  fake_unlock();
  if (r == CUDA_SUCCESS && fake_current == ctx) fake_current = NULL; /* popped from this thread */
  return r;
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuCtxDetach: old, still callable */
EXPORT CUresult cuCtxDetach(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

/* Green contexts: a handle and nothing behind it (the shim only warns). */
static int green_contexts;
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  (void)desc;
  (void)flags;
  if (out == NULL || dev < 0 || dev >= fake.device_count) return CUDA_ERROR_INVALID_VALUE;
  *out = (CUgreenCtx)&green_contexts;
  return CUDA_SUCCESS;
}

/* ---------------- synchronization ---------------- */

/* Every stream's epoch advances; a held stream keeps holding work recorded
 * afterwards. */
void fake_complete_all_streams(void) {
  fake.legacy_stream.epoch++;
  for (struct CUstream_st* s = fake_first_thread_stream(); s; s = s->thread_next) s->epoch++;
  for (struct CUstream_st* s = fake.streams; s; s = s->next) s->epoch++;
}

EXPORT CUresult cuCtxSynchronize(void) {
  fake_lock();
  CUresult r = fake_fault(FAULT_CTX_SYNCHRONIZE);
  if (r == CUDA_SUCCESS) r = fake_check_current();
  if (r == CUDA_SUCCESS) {
    fake.stats.ctx_sync++;
    fake_complete_all_streams();
    fake_invalidate_global_captures();
  }
  fake_unlock();
  return r;
}

/* ---------------- peer access ---------------- */

static int find_peer(const struct CUctx_st* c, const struct CUctx_st* peer) {
  for (int i = 0; i < c->npeers; ++i)
    if (c->peers[i].ctx == peer && c->peers[i].generation == peer->generation) return i;
  return -1;
}

/* What both peer calls check first (lock held). */
static CUresult check_peer(CUcontext peer) {
  CUresult r = fake_check_current();
  if (r != CUDA_SUCCESS) return r;
  if (peer == NULL || !peer->alive) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  fake_lock();
  struct CUctx_st* cur = fake_current;
  CUresult r = check_peer(peer);
  if (r == CUDA_SUCCESS && flags != 0) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && peer->device == cur->device) r = CUDA_ERROR_INVALID_DEVICE;
  if (r == CUDA_SUCCESS && find_peer(cur, peer) >= 0) r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  if (r == CUDA_SUCCESS) {
    /* Entries of peers destroyed since are dropped to make room. */
    int n = 0;
    for (int i = 0; i < cur->npeers; ++i)
      if (fake_ctx_live(cur->peers[i].ctx, cur->peers[i].generation)) cur->peers[n++] = cur->peers[i];
    cur->npeers = n;
    if (n == MAX_PEERS) r = CUDA_ERROR_TOO_MANY_PEERS;
  }
  if (r == CUDA_SUCCESS) {
    cur->peers[cur->npeers].ctx = peer;
    cur->peers[cur->npeers].generation = peer->generation;
    cur->npeers++;
    fake.stats.peer_enable++;
  }
  fake_unlock();
  return r;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  fake_lock();
  struct CUctx_st* cur = fake_current;
  CUresult r = check_peer(peer);
  int i = r == CUDA_SUCCESS ? find_peer(cur, peer) : -1;
  if (r == CUDA_SUCCESS && i < 0) r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  if (r == CUDA_SUCCESS) {
    cur->peers[i] = cur->peers[--cur->npeers];
    fake.stats.peer_disable++;
  }
  fake_unlock();
  return r;
}
