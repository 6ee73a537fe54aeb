/* fake_streams.c — streams, stream capture, events.
 *
 * Nothing runs on the fake's streams: completion is scripted.  A stream the
 * test holds busy (fake_cuda_hold_stream) leaves every event recorded on it
 * incomplete until the hold is released or something synchronizes it; an
 * event records, per held stream it waits for, that stream's epoch, and is
 * done once every such epoch has moved on.  The legacy stream orders
 * against every blocking stream, as on a GPU: an event on it waits for held
 * blocking streams and vice versa.  Destroyed streams are unlinked but never
 * freed (events recorded on them may still point there), so a record on one
 * is recognized and counted (record_on_dead_stream). */
#include <stdio.h>
#include <stdlib.h>

#include "fake_state.h"

static int event_dead(const struct CUevent_st* e) { return !fake_ctx_live(e->ctx, e->generation); }
static int stream_dead(const struct CUstream_st* s) { return !fake_ctx_live(s->ctx, s->generation); }

/* ---------------- context destruction ---------------- */

/* The context's streams are unlinked and dead (never freed: events recorded
 * on them may still point there). */
void fake_kill_streams_of(struct CUctx_st* c) {
  for (struct CUstream_st** p = &fake.streams; *p;) {
    struct CUstream_st* s = *p;
    if (s->ctx != c) { p = &s->next; continue; }
    *p = s->next;
    s->dead = 1;
  }
}

/* The context's events leave the registry: the driver freed them (the
 * structs stay, so that stale handles are recognized). */
void fake_forget_events_of(struct CUctx_st* c) {
  for (struct CUevent_st** p = &fake.events; *p;) {
    if ((*p)->ctx == c) *p = (*p)->next;
    else p = &(*p)->next;
  }
}

/* ---------------- streams ---------------- */

static CUresult create_stream(CUstream* out, unsigned int flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_fault(FAULT_STREAM_CREATE);
  if (r == CUDA_SUCCESS) r = fake_check_current();
  if (r != CUDA_SUCCESS) {
    fake_unlock();
    return r;
  }
  struct CUstream_st* s = calloc(1, sizeof *s);
  s->blocking = !(flags & CU_STREAM_NON_BLOCKING);
  s->ctx = fake_current;
  s->generation = fake_current->generation;
  s->next = fake.streams;
  fake.streams = s;
  fake.stats.stream_create++;
  fake_unlock();
  *out = s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream* out, unsigned int flags) { return create_stream(out, flags); }
/* A green context's stream: non-blocking, as cuda.h requires, and in the
 * fake simply a stream of the current context (the fake's green contexts
 * have nothing behind them; a context-wide event covers its work, as the
 * primary's cuCtxRecordEvent covers its green contexts' on a GPU). */
EXPORT CUresult cuGreenCtxStreamCreate(CUstream* out, CUgreenCtx green, unsigned int flags, int priority) {
  (void)priority;
  if (green == NULL || !(flags & CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  return create_stream(out, flags);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int priority) {
  (void)priority;
  return create_stream(out, flags);
}

EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int* flags) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st* st = fake_resolve_stream(s, 0);
  *flags = st->blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext* out) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  struct CUstream_st* st = fake_resolve_stream(s, 0);
  *out = (st == &fake.legacy_stream || st->ctx == NULL) ? fake_current : st->ctx;
  fake_unlock();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  if (stream_dead(s)) {
    CUresult r = fake_dead_call();
    fake_unlock();
    return r;
  }
  /* Unlinked but never freed: events recorded on it may still point here. */
  for (struct CUstream_st** p = &fake.streams; *p; p = &(*p)->next)
    if (*p == s) { *p = s->next; break; }
  s->dead = 1;
  fake.stats.stream_destroy++;
  fake_unlock();
  return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s, int ptsz) {
  fake_lock();
  fake.stats.stream_sync++;
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  CUresult r = CUDA_SUCCESS;
  if (stream_dead(st)) r = fake_dead_call();
  else if (st == &fake.legacy_stream) fake_complete_all_streams();
  else st->epoch++;
  fake_unlock();
  return r;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }

/* Busy while held, or while a held stream it is ordered after (as an event
 * recorded on it would wait) is: the fake does not track enqueued work. */
static int waits_pending(const struct CUstream_st* st) {
  for (int i = 0; i < st->nwaits; ++i)
    if (st->waits[i].s->epoch == st->waits[i].epoch) return 1;
  return 0;
}

static int stream_busy(const struct CUstream_st* st) {
  if (st->held || waits_pending(st)) return 1;
  if (st == &fake.legacy_stream) {
    for (const struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next)
      if (o->held || waits_pending(o)) return 1;
    for (const struct CUstream_st* o = fake.streams; o; o = o->next)
      if (o->blocking && (o->held || waits_pending(o))) return 1;
    return 0;
  }
  return st->blocking && fake.legacy_stream.held;
}

static CUresult stream_query(CUstream s, int ptsz) {
  fake_lock();
  CUresult r = fake_fault(FAULT_STREAM_QUERY);
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  if (r == CUDA_SUCCESS) {
    fake.stats.stream_query++;
    r = stream_dead(st) ? fake_dead_call() : stream_busy(st) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  }
  fake_unlock();
  return r;
}
EXPORT CUresult cuStreamQuery(CUstream s) { return stream_query(s, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, 1); }

/* ---------------- capture ---------------- */

/* A global-mode capture is invalidated by a call that would synchronize
 * with it: work recorded on the legacy stream, cuCtxSynchronize (lock held). */
void fake_invalidate_global_captures(void) {
  for (struct CUstream_st* o = fake.streams; o; o = o->next)
    if (o->capturing && o->capture_global && !o->capture_invalidated) {
      o->capture_invalidated = 1;
      fake.stats.capture_invalidations++;
    }
  for (struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next)
    if (o->capturing && o->capture_global && !o->capture_invalidated) {
      o->capture_invalidated = 1;
      fake.stats.capture_invalidations++;
    }
}

/* The capture is active before the test's hook (fake_cuda_on_begin_capture)
 * runs, still inside the call, as a real begin is before it returns. */
static CUresult begin_capture(CUstream s, CUstreamCaptureMode m, int ptsz) {
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  if (st == &fake.legacy_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  fake_lock();
  st->capturing = 1;
  st->capture_global = m == CU_STREAM_CAPTURE_MODE_GLOBAL;
  st->capture_mode = m;
  st->capture_thread = pthread_self();
  st->capture_invalidated = 0;
  void (*hook)(void*) = fake.on_begin_capture;
  void* arg = fake.on_begin_capture_arg;
  fake_unlock();
  if (hook) hook(arg);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, m, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, m, 1); }

static CUresult end_capture(CUstream s, CUgraph* g, int ptsz) {
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  fake_lock();
  int was = st->capturing, invalidated = st->capture_invalidated;
  st->capturing = 0;
  struct CUgraph_st* graph = was && !invalidated && g ? fake_new_graph() : NULL;
  fake_unlock();
  if (!was) return CUDA_ERROR_ILLEGAL_STATE;
  if (invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (g) *g = graph;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) { return end_capture(s, g, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return end_capture(s, g, 1); }

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus* out, int ptsz) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  *out = fake_resolve_stream(s, ptsz)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  fake_unlock();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 1); }

/* ---------------- events ---------------- */

EXPORT CUresult cuEventCreate(CUevent* out, unsigned int flags) {
  (void)flags;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_fault(FAULT_EVENT_CREATE);
  if (r == CUDA_SUCCESS) r = fake_check_current();
  if (r == CUDA_SUCCESS) {
    struct CUevent_st* e = calloc(1, sizeof *e);
    e->ctx = fake_current;
    e->generation = fake_current->generation;
    e->next = fake.events;
    fake.events = e;
    fake.stats.event_create++;
    *out = e;
  }
  fake_unlock();
  return r;
}

/* Appends (s, epoch) to a dependency list of n entries: once, and after
 * dropping completed entries when the list is full.  A list of MAX_DEPS
 * pending ones aborts, loudly: silently dropping one (as this fake once did)
 * made work look complete early, which the stress test then reported as an
 * early reuse by cachalloc (or would have hidden a real one). */
static void fake_deps_add(struct fake_dep* d, int* n, struct CUstream_st* s, unsigned epoch) {
  for (int i = 0; i < *n; ++i)
    if (d[i].s == s && d[i].epoch == epoch) return;
  if (*n == MAX_DEPS) {
    int k = 0;
    for (int i = 0; i < *n; ++i)
      if (d[i].s->epoch == d[i].epoch) d[k++] = d[i];
    *n = k;
  }
  if (*n == MAX_DEPS) {
    fprintf(stderr, "fake libcuda: more than %d pending dependencies on one event or stream\n", MAX_DEPS);
    abort();
  }
  d[*n].s = s;
  d[*n].epoch = epoch;
  ++*n;
}

static void add_dep_on(struct CUevent_st* e, struct CUstream_st* s, unsigned epoch) {
  fake_deps_add(e->deps, &e->ndeps, s, epoch);
}

/* The event waits for `s`'s held work and for what `s` was made to wait
 * for (cuStreamWaitEvent) that is still pending. */
static void add_dep(struct CUevent_st* e, struct CUstream_st* s) {
  if (s->held) add_dep_on(e, s, s->epoch);
  for (int i = 0; i < s->nwaits; ++i)
    if (s->waits[i].s->epoch == s->waits[i].epoch) add_dep_on(e, s->waits[i].s, s->waits[i].epoch);
}

/* ...and for what the event's context was made to wait for (cuCtxWaitEvent):
 * every stream of the context, whenever created, is ordered after it. */
static void add_ctx_waits(struct CUevent_st* e) {
  const struct CUctx_st* c = e->ctx;
  if (c == NULL) return;
  for (int i = 0; i < c->nwaits; ++i)
    if (c->waits[i].s->epoch == c->waits[i].epoch) add_dep_on(e, c->waits[i].s, c->waits[i].epoch);
}

/* The event waits for the held streams its stream is ordered after. */
static CUresult event_record(CUevent e, CUstream s, int ptsz) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  CUresult r = fake_fault(FAULT_EVENT_RECORD);
  if (r != CUDA_SUCCESS) {
    fake_unlock();
    return r;
  }
  fake.stats.event_record++;
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  if (event_dead(e)) {
    r = fake_dead_call();
    fake_unlock();
    return r;
  }
  if (st->dead) { /* the real driver dereferences freed memory here */
    fake.stats.record_on_dead_stream++;
    if (stream_dead(st)) fake.stats.dead_context_calls++;
    fake_unlock();
    return CUDA_ERROR_INVALID_HANDLE;
  }
  e->ndeps = 0;
  add_dep(e, st);
  if (st == &fake.legacy_stream) fake_invalidate_global_captures();
  if (st == &fake.legacy_stream) {
    for (struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next) add_dep(e, o);
    for (struct CUstream_st* o = fake.streams; o; o = o->next)
      if (o->blocking) add_dep(e, o);
  } else if (st->blocking) {
    add_dep(e, &fake.legacy_stream);
  }
  add_ctx_waits(e);
  fake_unlock();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

/* cuCtxRecordEvent: the event waits for all of the context's work — the
 * legacy stream, every thread's per-thread stream, its created streams,
 * non-blocking ones included.  Refused, invalidating them, while any stream
 * captures (as the driver documents).  FAKE_CUDA_NO_CTX_RECORD_EVENT=1 makes
 * it answer CUDA_ERROR_NOT_SUPPORTED, as a driver without it would. */
static int any_capture(void) {
  for (struct CUstream_st* o = fake.streams; o; o = o->next)
    if (o->capturing) return 1;
  for (struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next)
    if (o->capturing) return 1;
  return 0;
}

/* What cuCtxRecordEvent and cuCtxWaitEvent check first (lock held): an
 * injected fault, objects of a dead context, and any capture in flight,
 * which both refuse and invalidate. */
static CUresult ctx_event_checks(CUcontext ctx, CUevent e, enum fake_fault_point point) {
  CUresult r = fake_fault(point);
  if (r == CUDA_SUCCESS && (event_dead(e) || !fake_ctx_live(ctx, ctx->generation))) r = fake_dead_call();
  if (r == CUDA_SUCCESS && any_capture()) {
    for (struct CUstream_st* o = fake.streams; o; o = o->next)
      if (o->capturing && !o->capture_invalidated) o->capture_invalidated = 1, fake.stats.capture_invalidations++;
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return r;
}

EXPORT CUresult cuCtxRecordEvent(CUcontext ctx, CUevent e) {
  if (e == NULL || ctx == NULL) return CUDA_ERROR_INVALID_HANDLE;
  const char* off = getenv("FAKE_CUDA_NO_CTX_RECORD_EVENT");
  if (off != NULL && *off == '1') return CUDA_ERROR_NOT_SUPPORTED;
  fake_lock();
  CUresult r = ctx_event_checks(ctx, e, FAULT_EVENT_RECORD);
  if (r == CUDA_SUCCESS) {
    fake.stats.event_record++;
    fake.stats.ctx_record_event++;
    e->ndeps = 0;
    add_dep(e, &fake.legacy_stream);
    for (struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next) add_dep(e, o);
    for (struct CUstream_st* o = fake.streams; o; o = o->next)
      if (o->ctx == ctx) add_dep(e, o);
    add_ctx_waits(e);
  }
  fake_unlock();
  return r;
}

/* cuCtxWaitEvent: all work enqueued on the context from now on — on any
 * stream, created before or after — waits for the event's pending work.
 * Refused and invalidating, like cuCtxRecordEvent, while a stream captures;
 * FAKE_CUDA_NO_CTX_WAIT_EVENT=1 makes it answer CUDA_ERROR_NOT_SUPPORTED. */
EXPORT CUresult cuCtxWaitEvent(CUcontext ctx, CUevent e) {
  if (e == NULL || ctx == NULL) return CUDA_ERROR_INVALID_HANDLE;
  const char* off = getenv("FAKE_CUDA_NO_CTX_WAIT_EVENT");
  if (off != NULL && *off == '1') return CUDA_ERROR_NOT_SUPPORTED;
  fake_lock();
  CUresult r = ctx_event_checks(ctx, e, FAULT_CTX_WAIT_EVENT);
  if (r == CUDA_SUCCESS) {
    fake.stats.ctx_wait_event++;
    for (int i = 0; i < e->ndeps; ++i)
      if (e->deps[i].s->epoch == e->deps[i].epoch) fake_deps_add(ctx->waits, &ctx->nwaits, e->deps[i].s, e->deps[i].epoch);
  }
  fake_unlock();
  return r;
}

/* Work enqueued on the stream from now on waits for the event's pending
 * dependencies. */
static CUresult stream_wait_event(CUstream s, CUevent e, int ptsz) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  fake.stats.stream_wait_event++;
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  CUresult r = CUDA_SUCCESS;
  if (stream_dead(st) || event_dead(e)) r = fake_dead_call();
  for (int i = 0; r == CUDA_SUCCESS && i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) fake_deps_add(st->waits, &st->nwaits, e->deps[i].s, e->deps[i].epoch);
  fake_unlock();
  return r;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  (void)flags;
  return stream_wait_event(s, e, 0);
}
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) {
  (void)flags;
  return stream_wait_event(s, e, 1);
}

/* ---------------- work ---------------- */

/* A kernel launch: nothing runs; counted per stream kind, so that tests see
 * which stream the program's work went to. */
FAKE_INTERNAL CUresult fake_launch(CUstream s, int ptsz) {
  fake_lock();
  struct CUstream_st* st = fake_resolve_stream(s, ptsz);
  CUresult r = stream_dead(st) ? fake_dead_call() : fake_check_current();
  if (r == CUDA_SUCCESS) {
    fake.stats.launches++;
    if (st->ctx == NULL && st != &fake.legacy_stream) fake.stats.per_thread_launches++;
    if (st->held) {
      st->launched = 1;
      st->launched_epoch = st->epoch;
    }
  }
  fake_unlock();
  return r;
}
static int kernel_running(const struct CUstream_st* st) {
  return st->held && st->launched && st->epoch == st->launched_epoch;
}

int fake_kernels_in_flight(void) {
  if (kernel_running(&fake.legacy_stream)) return 1;
  for (const struct CUstream_st* s = fake_first_thread_stream(); s; s = s->thread_next)
    if (kernel_running(s)) return 1;
  for (const struct CUstream_st* s = fake.streams; s; s = s->next)
    if (kernel_running(s)) return 1;
  return 0;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
  return fake_launch(s, 0);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
  return fake_launch(s, 1);
}

static int event_done(const struct CUevent_st* e) {
  for (int i = 0; i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) return 0;
  return 1;
}

EXPORT CUresult cuEventQuery(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  CUresult r = fake_fault(FAULT_EVENT_QUERY);
  if (r == CUDA_SUCCESS) {
    fake.stats.event_query++;
    r = event_dead(e) ? fake_dead_call() : event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  }
  fake_unlock();
  return r;
}

/* Waiting for an event completes the work it depends on. */
EXPORT CUresult cuEventSynchronize(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  CUresult r = fake_fault(FAULT_EVENT_SYNCHRONIZE);
  if (r == CUDA_SUCCESS) {
    fake.stats.event_sync++;
    r = event_dead(e) ? fake_dead_call() : CUDA_SUCCESS;
  }
  for (int i = 0; r == CUDA_SUCCESS && i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) e->deps[i].s->epoch++;
  fake_unlock();
  return r;
}

/* An event of a destroyed context was freed with it: refused, kept. */
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  fake.stats.event_destroy++;
  CUresult r = event_dead(e) ? fake_dead_call() : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS)
    for (struct CUevent_st** p = &fake.events; *p; p = &(*p)->next)
      if (*p == e) { *p = e->next; break; }
  fake_unlock();
  if (r == CUDA_SUCCESS) free(e);
  return r;
}
