/* fake_libcuda.c — a libcuda.so.1 that runs on the host, for the shim's tests.
 *
 * Built as tests/fake/libcuda.so.1.  Device memory is host memory counted
 * against a configurable total (FAKE_CUDA_TOTAL_MB, default 1024) so that
 * out-of-memory can be provoked.  Each cuMemAlloc allocation is a memfd
 * (whole 2 MiB pages) mapped shared, so another process can map it through
 * cuIpcOpenMemHandle.  Streams, events and contexts are small host structs.
 * Completion of GPU work is scripted: a stream the test holds busy
 * (fake_cuda_hold_stream) leaves every event recorded on it incomplete until
 * released or synchronized.  The legacy stream orders against every blocking
 * stream, as on a GPU: an event on it waits for held blocking streams and
 * vice versa.
 *
 * Where the real driver's behaviour was measured (H100, driver 580, CUDA 13)
 * the fake copies it: address ranges and pointer attributes, the IPC
 * handle's layout and open/close reference rules, context destruction (a
 * primary context keeps its handle and gets a new generation when it
 * restarts), peer access.  Calls that name objects of a destroyed context
 * fail and are counted (dead_context_calls): a real driver may crash there.
 * cuGetProcAddress(_v2) resolves base names by version and flags into the
 * fake's own functions (never through dlsym, which the shim hooks).
 * Every entry point takes one global lock: tests are small, clarity wins. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
/* The fake defines the unversioned names too (cuda.h maps them to _v2). */
#undef cuGetProcAddress
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle

#include "fake_libcuda.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 4
#define MAX_DEPS 32
#define MAX_PEERS 8
#define PAGE ((size_t)4096)
#define ALLOC_PAGE ((size_t)2 << 20) /* cuMemAlloc maps whole 2 MiB pages */
#define VM_GRANULARITY ((size_t)2 << 20)
#define FIRST_BUFFER_ID 1000ULL
#define BLOCK_ID_BIAS 1000000ULL     /* MEMORY_BLOCK_ID = a buffer id + this */

struct ctx_ref { struct CUctx_st* ctx; unsigned generation; };
struct CUctx_st {
  int device;
  int alive;            /* created, or a primary between retain and release/reset */
  unsigned generation;  /* new each time the context starts: stale objects show */
  int primary;
  int refcount;         /* primaries: retains not yet released */
  int npeers;           /* contexts whose memory this one may access */
  struct ctx_ref peers[MAX_PEERS];
};
struct CUstream_st {
  int held;                  /* work recorded now stays incomplete */
  unsigned epoch;            /* bumped whenever pending work completes */
  int capturing;
  int blocking;              /* orders against the legacy stream */
  struct CUstream_st* next;  /* registry of created streams */
  int dead;                  /* destroyed: the real driver may crash on it */
  struct CUctx_st* ctx;      /* owner (NULL for the default streams) */
  unsigned generation;
};
struct CUevent_st {
  int ndeps;
  struct { struct CUstream_st* s; unsigned epoch; } deps[MAX_DEPS];
  struct CUctx_st* ctx;
  unsigned generation;
};
struct CUgraph_st { int unused; };

/* cuMemAlloc / cuMemAllocAsync memory. */
struct allocation {
  void* ptr;
  size_t size;      /* as requested */
  size_t rounded;   /* counted against the device total (512 B units) */
  size_t mapping;   /* the memfd's size: whole 2 MiB pages */
  int fd;           /* open while the allocation lives (IPC) */
  struct CUctx_st* ctx;
  unsigned long long buffer_id;
  unsigned sync_memops;
  int graph;        /* allocated on a capturing stream: a graph allocation */
};

/* Memory mapped by cuIpcOpenMemHandle: one per distinct handle. */
struct import {
  unsigned char handle[CU_IPC_HANDLE_SIZE];
  void* map;              /* the exporter's pages, page-aligned */
  size_t map_len;
  CUdeviceptr ptr;        /* what the open returned */
  size_t size;            /* the handle's size field */
  pid_t pid;              /* exporter and its allocation */
  unsigned long long source_id;
  uint64_t offset;
  int refs;
  struct CUctx_st* ctx;
  unsigned long long buffer_id;
  unsigned sync_memops;
  struct import* next;
};

/* Virtual memory: reservations, physical allocations, mappings. */
struct reservation { CUdeviceptr base; size_t size; struct reservation* next; };
struct physical { int fd; size_t size; int device; unsigned long long id; struct physical* next; };
struct vm_mapping {
  CUdeviceptr ptr;
  size_t size;
  int device;               /* where the physical memory lives */
  struct CUctx_st* ctx;     /* current at cuMemMap */
  int dead;                 /* its context was destroyed */
  unsigned long long buffer_id, block_id;
  unsigned sync_memops;
  unsigned char* access;    /* [granule][device]: CUmemAccess_flags */
  CUmemGenericAllocationHandle handle;  /* what cuMemRetainAllocationHandle returns */
  struct vm_mapping* next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_cuda_stats_t stats;
static int initialized;
static int device_count = 1;
static struct CUctx_st primary[MAX_DEVICES];
static unsigned generations;
static unsigned long long next_buffer_id = FIRST_BUFFER_ID;
static __thread CUcontext current;
static struct CUstream_st legacy_stream = {.blocking = 1};
static __thread struct CUstream_st per_thread_stream = {.blocking = 1};
static struct CUstream_st* streams;  /* created streams */
static struct allocation* allocs;
static size_t nallocs, cap_allocs;
static struct import* imports;
static struct reservation* reservations;
static struct physical* physicals;
static struct vm_mapping* mappings;
static struct CUgraph_st the_graph;
static const char ipc_magic[8] = "fakeipc";

static void lock_fake(void) { pthread_mutex_lock(&lock); }
static void unlock_fake(void) { pthread_mutex_unlock(&lock); }

static size_t env_size(const char* name, size_t def) {
  const char* v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 10) : def;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* An fd per live allocation: lift the soft limit so that tests with many
 * live allocations do not run out. */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= 65536 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
  setrlimit(RLIMIT_NOFILE, &rl);
}

static void init_once(void) {
  static int done;
  if (done) return;
  done = 1;
  stats.total_bytes = env_size("FAKE_CUDA_TOTAL_MB", 1024) << 20;
  device_count = (int)env_size("FAKE_CUDA_DEVICES", 1);
  if (device_count < 1 || device_count > MAX_DEVICES) device_count = 1;
  for (int i = 0; i < MAX_DEVICES; ++i) {
    primary[i].device = i;
    primary[i].primary = 1;
  }
  raise_fd_limit();
}

/* Maps a stream handle as the driver would: 0 is the default stream of the
 * calling convention (legacy, or per-thread for _ptsz entry points). */
static struct CUstream_st* resolve_stream(CUstream s, int ptsz) {
  if (s == NULL) return ptsz ? &per_thread_stream : &legacy_stream;
  if (s == CU_STREAM_LEGACY) return &legacy_stream;
  if (s == CU_STREAM_PER_THREAD) return &per_thread_stream;
  return s;
}

/* ---------------- context liveness ---------------- */

/* An object made in context `c` at `generation` is still usable. */
static int ctx_live(const struct CUctx_st* c, unsigned generation) {
  return c == NULL || (c->alive && c->generation == generation);
}

/* The calling thread's context can be used (lock held). */
static CUresult check_current(void) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return current->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* A call naming an object of a destroyed context (lock held). */
static CUresult dead_call(void) {
  stats.dead_context_calls++;
  return CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

static int event_dead(const struct CUevent_st* e) { return !ctx_live(e->ctx, e->generation); }
static int stream_dead(const struct CUstream_st* s) { return !ctx_live(s->ctx, s->generation); }

/* ---------------- memory bookkeeping ---------------- */

/* The memfd's name carries the buffer id, so that an importer can tell a
 * reused fd number from the allocation its handle describes. */
static void memfd_name(char* out, size_t n, unsigned long long id) { snprintf(out, n, "fake-cuda-%llu", id); }

/* A memfd of `len` bytes mapped shared; its fd in *fd_out. */
static void* map_memfd(unsigned long long id, size_t len, int* fd_out) {
  char name[32];
  memfd_name(name, sizeof name, id);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return NULL;
  void* p = ftruncate(fd, (off_t)len) == 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  *fd_out = fd;
  return p;
}

static CUresult add_allocation(CUdeviceptr* out, size_t size) {
  if (out == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_current();
  if (r != CUDA_SUCCESS) return r;
  if (size > stats.total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t rounded = round_up(size, 512);
  if (stats.live_bytes + rounded > stats.total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  struct allocation a = {0};
  a.size = size;
  a.rounded = rounded;
  a.mapping = round_up(size, ALLOC_PAGE);
  a.ctx = current;
  a.buffer_id = next_buffer_id++;
  a.ptr = map_memfd(a.buffer_id, a.mapping, &a.fd);
  if (a.ptr == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (nallocs == cap_allocs) {
    cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
    allocs = realloc(allocs, cap_allocs * sizeof *allocs);
  }
  allocs[nallocs++] = a;
  stats.live_bytes += rounded;
  stats.live_allocs++;
  *out = (CUdeviceptr)(uintptr_t)a.ptr;
  return CUDA_SUCCESS;
}

static void free_allocation(size_t i) {
  munmap(allocs[i].ptr, allocs[i].mapping);
  close(allocs[i].fd);
  stats.live_bytes -= allocs[i].rounded;
  stats.live_allocs--;
  allocs[i] = allocs[--nallocs];
}

/* Frees an allocation the fake handed out; anything else (an interior
 * pointer, a pointer freed twice, memory of a destroyed context) is
 * CUDA_ERROR_INVALID_VALUE. */
static CUresult remove_allocation(CUdeviceptr ptr) {
  for (size_t i = 0; i < nallocs; ++i) {
    if ((CUdeviceptr)(uintptr_t)allocs[i].ptr != ptr) continue;
    free_allocation(i);
    return CUDA_SUCCESS;
  }
  stats.mem_free_invalid++;
  return CUDA_ERROR_INVALID_VALUE;
}

static struct allocation* find_allocation(CUdeviceptr p) {
  for (size_t i = 0; i < nallocs; ++i) {
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)allocs[i].ptr;
    if (p >= base && p - base < allocs[i].size) return &allocs[i];
  }
  return NULL;
}

static struct import* find_import(CUdeviceptr p) {
  for (struct import* m = imports; m; m = m->next)
    if (p >= m->ptr && p - m->ptr < m->size) return m;
  return NULL;
}

/* The live VM mapping holding p. */
static struct vm_mapping* find_mapping(CUdeviceptr p) {
  for (struct vm_mapping* m = mappings; m; m = m->next)
    if (!m->dead && p >= m->ptr && p - m->ptr < m->size) return m;
  return NULL;
}

static struct reservation* find_reservation(CUdeviceptr p) {
  for (struct reservation* r = reservations; r; r = r->next)
    if (p >= r->base && p - r->base < r->size) return r;
  return NULL;
}

/* ---------------- what a device pointer lies in ----------------
 * One view of cuMemAlloc memory, IPC imports and VM mappings for
 * cuMemGetAddressRange and the pointer attributes. */

struct region {
  CUdeviceptr base; size_t size;               /* cuMemGetAddressRange */
  CUdeviceptr range_start; size_t range_size;  /* RANGE_START_ADDR / RANGE_SIZE */
  CUdeviceptr map_base; size_t map_size;       /* MAPPING_BASE_ADDR / MAPPING_SIZE */
  struct CUctx_st* ctx;
  int device;
  unsigned long long buffer_id, block_id, handle_types;
  unsigned ipc_capable, access;
  unsigned* sync_memops;
};

static void region_of_allocation(struct region* r, struct allocation* a) {
  r->base = r->range_start = r->map_base = (CUdeviceptr)(uintptr_t)a->ptr;
  r->size = r->range_size = a->size;
  r->map_size = a->mapping;
  r->ctx = a->ctx;
  r->device = a->ctx->device;
  r->buffer_id = a->buffer_id;
  r->block_id = a->buffer_id + BLOCK_ID_BIAS;
  r->ipc_capable = 1;
  r->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r->sync_memops = &a->sync_memops;
}

static void region_of_import(struct region* r, struct import* m) {
  r->base = r->range_start = r->map_base = m->ptr;
  r->size = r->range_size = m->size;
  r->map_size = round_up(m->size, ALLOC_PAGE);
  r->ctx = m->ctx;
  r->device = m->ctx->device;
  r->buffer_id = m->buffer_id;
  r->block_id = m->buffer_id + BLOCK_ID_BIAS;
  r->ipc_capable = 1;
  r->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r->sync_memops = &m->sync_memops;
}

static unsigned vm_flags(const struct vm_mapping* m, CUdeviceptr p, int device) {
  return m->access[(p - m->ptr) / VM_GRANULARITY * MAX_DEVICES + (size_t)device];
}

/* RANGE_* is the whole reservation; ACCESS_FLAGS is what the current
 * context's device (else the owner) was granted at p. */
static void region_of_mapping(struct region* r, struct vm_mapping* m, CUdeviceptr p) {
  struct reservation* res = find_reservation(m->ptr);
  r->base = r->map_base = m->ptr;
  r->size = r->map_size = m->size;
  r->range_start = res ? res->base : m->ptr;
  r->range_size = res ? res->size : m->size;
  r->device = m->device;
  r->buffer_id = m->buffer_id;
  r->block_id = m->block_id;
  r->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  r->access = vm_flags(m, p, current && current->alive ? current->device : m->device);
  r->sync_memops = &m->sync_memops;
}

/* Fills *r for p; 0 when p is in no live memory (lock held). */
static int find_region(CUdeviceptr p, struct region* r) {
  memset(r, 0, sizeof *r);
  struct allocation* a = find_allocation(p);
  if (a) { region_of_allocation(r, a); return 1; }
  struct import* m = find_import(p);
  if (m) { region_of_import(r, m); return 1; }
  struct vm_mapping* v = find_mapping(p);
  if (v) { region_of_mapping(r, v, p); return 1; }
  return 0;
}

/* ---------------- context destruction ---------------- */

static void drop_imports_of(struct CUctx_st* c) {
  for (struct import** p = &imports; *p;) {
    struct import* m = *p;
    if (m->ctx != c) { p = &m->next; continue; }
    *p = m->next;
    munmap(m->map, m->map_len);
    free(m);
  }
}

/* The context's streams are unlinked and dead (never freed: events recorded
 * on them may still point there). */
static void kill_streams_of(struct CUctx_st* c) {
  for (struct CUstream_st** p = &streams; *p;) {
    struct CUstream_st* s = *p;
    if (s->ctx != c) { p = &s->next; continue; }
    *p = s->next;
    s->dead = 1;
  }
}

/* Frees everything the context owns; its events die with its generation. */
static void destroy_context(struct CUctx_st* c) {
  c->alive = 0;
  c->refcount = 0;
  c->npeers = 0;
  for (size_t i = nallocs; i-- > 0;)
    if (allocs[i].ctx == c) free_allocation(i);
  drop_imports_of(c);
  kill_streams_of(c);
  /* cuMemCreate memory, its mappings and address reservations are not
   * context memory (cuda.h: "cuCtxDestroy() will not destroy memory
   * allocations by cuMemCreate()"; measured on an H100): they outlive the
   * context and must be released explicitly. */
  stats.ctx_destroyed++;
}

static void start_context(struct CUctx_st* c) {
  c->alive = 1;
  c->generation = ++generations;
  c->npeers = 0;
}

/* ---------------- init, devices, contexts ---------------- */

EXPORT CUresult cuInit(unsigned int flags) {
  (void)flags;
  lock_fake();
  init_once();
  initialized = 1;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = device_count;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  init_once();
  *bytes = stats.total_bytes;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 1; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

/* The handle is always &primary[d]; an inactive primary starts again with
 * a new generation, as the real driver's does. */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  struct CUctx_st* c = &primary[d];
  if (!c->alive) start_context(c);
  c->refcount++;
  unlock_fake();
  *ctx = c;
  return CUDA_SUCCESS;
}

/* The last release destroys the primary context. */
static CUresult release_primary(CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  struct CUctx_st* c = &primary[d];
  CUresult r = c->refcount > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (r == CUDA_SUCCESS && --c->refcount == 0) destroy_context(c);
  unlock_fake();
  return r;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return release_primary(d); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return release_primary(d); }

/* Destroys the primary context whatever its reference count.  Threads that
 * had it current keep the handle (calls then fail with 709). */
static CUresult reset_primary(CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  if (primary[d].alive) destroy_context(&primary[d]);
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return reset_primary(d); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return reset_primary(d); }

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  *flags = 0;
  *active = primary[d].alive;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  lock_fake();
  CUresult r = check_current();
  if (r == CUDA_SUCCESS) *d = current->device;
  unlock_fake();
  return r;
}

static CUresult create_context(CUcontext* out, CUdevice d) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st* c = calloc(1, sizeof *c);
  c->device = d;
  lock_fake();
  start_context(c);
  unlock_fake();
  current = c;
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
  lock_fake();
  CUresult r = CUDA_SUCCESS;
  if (ctx->primary) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (!ctx->alive) { /* destroyed twice */
    dead_call();
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    destroy_context(ctx);
  }
  unlock_fake();
  if (r == CUDA_SUCCESS && current == ctx) current = NULL; /* popped from this thread */
  return r;
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

/* Synchronizing completes all work enqueued so far: every stream's epoch
 * advances; a held stream keeps holding work recorded afterwards. */
static void complete_all_streams(void) {
  legacy_stream.epoch++;
  per_thread_stream.epoch++;
  for (struct CUstream_st* s = streams; s; s = s->next) s->epoch++;
}

EXPORT CUresult cuCtxSynchronize(void) {
  lock_fake();
  CUresult r = check_current();
  if (r == CUDA_SUCCESS) {
    stats.ctx_sync++;
    complete_all_streams();
  }
  unlock_fake();
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
  CUresult r = check_current();
  if (r != CUDA_SUCCESS) return r;
  if (peer == NULL || !peer->alive) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  lock_fake();
  CUresult r = check_peer(peer);
  if (r == CUDA_SUCCESS && flags != 0) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && peer->device == current->device) r = CUDA_ERROR_INVALID_DEVICE;
  if (r == CUDA_SUCCESS && find_peer(current, peer) >= 0) r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  if (r == CUDA_SUCCESS) {
    /* Entries of peers destroyed since are dropped to make room. */
    int n = 0;
    for (int i = 0; i < current->npeers; ++i)
      if (ctx_live(current->peers[i].ctx, current->peers[i].generation)) current->peers[n++] = current->peers[i];
    current->npeers = n;
    if (n == MAX_PEERS) r = CUDA_ERROR_TOO_MANY_PEERS;
  }
  if (r == CUDA_SUCCESS) {
    current->peers[current->npeers].ctx = peer;
    current->peers[current->npeers].generation = peer->generation;
    current->npeers++;
    stats.peer_enable++;
  }
  unlock_fake();
  return r;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  lock_fake();
  CUresult r = check_peer(peer);
  int i = r == CUDA_SUCCESS ? find_peer(current, peer) : -1;
  if (r == CUDA_SUCCESS && i < 0) r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  if (r == CUDA_SUCCESS) {
    current->peers[i] = current->peers[--current->npeers];
    stats.peer_disable++;
  }
  unlock_fake();
  return r;
}

/* ---------------- streams ---------------- */

static CUresult create_stream(CUstream* out, unsigned int flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  CUresult r = check_current();
  if (r != CUDA_SUCCESS) {
    unlock_fake();
    return r;
  }
  struct CUstream_st* s = calloc(1, sizeof *s);
  s->blocking = !(flags & CU_STREAM_NON_BLOCKING);
  s->ctx = current;
  s->generation = current->generation;
  s->next = streams;
  streams = s;
  stats.stream_create++;
  unlock_fake();
  *out = s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream* out, unsigned int flags) { return create_stream(out, flags); }

EXPORT CUresult cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int priority) {
  (void)priority;
  return create_stream(out, flags);
}

EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int* flags) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st* st = resolve_stream(s, 0);
  *flags = st->blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  if (stream_dead(s)) {
    CUresult r = dead_call();
    unlock_fake();
    return r;
  }
  /* Unlinked but never freed: events recorded on it may still point here. */
  for (struct CUstream_st** p = &streams; *p; p = &(*p)->next)
    if (*p == s) { *p = s->next; break; }
  s->dead = 1;
  stats.stream_destroy++;
  unlock_fake();
  return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s, int ptsz) {
  lock_fake();
  stats.stream_sync++;
  struct CUstream_st* st = resolve_stream(s, ptsz);
  CUresult r = CUDA_SUCCESS;
  if (stream_dead(st)) r = dead_call();
  else if (st == &legacy_stream) complete_all_streams();
  else st->epoch++;
  unlock_fake();
  return r;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }

static CUresult begin_capture(CUstream s, int ptsz) {
  struct CUstream_st* st = resolve_stream(s, ptsz);
  if (st == &legacy_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  lock_fake();
  st->capturing = 1;
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { (void)m; return begin_capture(s, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { (void)m; return begin_capture(s, 1); }

static CUresult end_capture(CUstream s, CUgraph* g, int ptsz) {
  struct CUstream_st* st = resolve_stream(s, ptsz);
  lock_fake();
  int was = st->capturing;
  st->capturing = 0;
  unlock_fake();
  if (!was) return CUDA_ERROR_ILLEGAL_STATE;
  if (g) *g = &the_graph;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) { return end_capture(s, g, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return end_capture(s, g, 1); }

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus* out, int ptsz) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  *out = resolve_stream(s, ptsz)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 1); }

/* ---------------- events ---------------- */

EXPORT CUresult cuEventCreate(CUevent* out, unsigned int flags) {
  (void)flags;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  CUresult r = check_current();
  if (r == CUDA_SUCCESS) {
    struct CUevent_st* e = calloc(1, sizeof *e);
    e->ctx = current;
    e->generation = current->generation;
    stats.event_create++;
    *out = e;
  }
  unlock_fake();
  return r;
}

static void add_dep(struct CUevent_st* e, struct CUstream_st* s) {
  if (s->held && e->ndeps < MAX_DEPS) {
    e->deps[e->ndeps].s = s;
    e->deps[e->ndeps].epoch = s->epoch;
    e->ndeps++;
  }
}

/* The event waits for the held streams its stream is ordered after. */
static CUresult event_record(CUevent e, CUstream s, int ptsz) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_record++;
  struct CUstream_st* st = resolve_stream(s, ptsz);
  if (event_dead(e)) {
    CUresult r = dead_call();
    unlock_fake();
    return r;
  }
  if (st->dead) { /* the real driver dereferences freed memory here */
    stats.record_on_dead_stream++;
    if (stream_dead(st)) stats.dead_context_calls++;
    unlock_fake();
    return CUDA_ERROR_INVALID_HANDLE;
  }
  e->ndeps = 0;
  add_dep(e, st);
  if (st == &legacy_stream) {
    add_dep(e, &per_thread_stream);
    for (struct CUstream_st* o = streams; o; o = o->next)
      if (o->blocking) add_dep(e, o);
  } else if (st->blocking) {
    add_dep(e, &legacy_stream);
  }
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

static int event_done(const struct CUevent_st* e) {
  for (int i = 0; i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) return 0;
  return 1;
}

EXPORT CUresult cuEventQuery(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_query++;
  CUresult r = event_dead(e) ? dead_call() : event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  unlock_fake();
  return r;
}

/* Waiting for an event completes the work it depends on. */
EXPORT CUresult cuEventSynchronize(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_sync++;
  CUresult r = event_dead(e) ? dead_call() : CUDA_SUCCESS;
  for (int i = 0; r == CUDA_SUCCESS && i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) e->deps[i].s->epoch++;
  unlock_fake();
  return r;
}

/* An event of a destroyed context was freed with it: refused, kept. */
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_destroy++;
  CUresult r = event_dead(e) ? dead_call() : CUDA_SUCCESS;
  unlock_fake();
  if (r == CUDA_SUCCESS) free(e);
  return r;
}

/* ---------------- memory ---------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t size) {
  lock_fake();
  init_once();
  CUresult r = add_allocation(out, size);
  if (r == CUDA_SUCCESS) stats.mem_alloc++;
  else stats.mem_alloc_failed++;
  unlock_fake();
  return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  if (ptr == 0) return CUDA_SUCCESS;
  lock_fake();
  CUresult r = remove_allocation(ptr);
  if (r == CUDA_SUCCESS) stats.mem_free++;
  unlock_fake();
  return r;
}

static CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream s, int ptsz) {
  lock_fake();
  init_once();
  CUresult r = add_allocation(out, size);
  if (r == CUDA_SUCCESS && resolve_stream(s, ptsz)->capturing) find_allocation(*out)->graph = 1;
  if (r == CUDA_SUCCESS) {
    stats.mem_alloc_async++;
    if (ptsz) stats.mem_alloc_async_ptsz++;
  } else {
    stats.mem_alloc_failed++;
  }
  unlock_fake();
  return r;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 1); }

/* During a capture the real driver frees only graph allocations (made on a
 * capturing stream): any other pointer is CUDA_ERROR_INVALID_VALUE. */
static CUresult free_async(CUdeviceptr ptr, CUstream s, int ptsz) {
  if (ptr == 0) return CUDA_SUCCESS;
  lock_fake();
  struct allocation* a = find_allocation(ptr);
  const int refused = resolve_stream(s, ptsz)->capturing && (a == NULL || !a->graph);
  CUresult r = refused ? CUDA_ERROR_INVALID_VALUE : remove_allocation(ptr);
  if (r == CUDA_SUCCESS) {
    stats.mem_free_async++;
    if (ptsz) stats.mem_free_async_ptsz++;
  }
  unlock_fake();
  return r;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 1); }

EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  lock_fake();
  init_once();
  CUresult r = check_current();
  if (r == CUDA_SUCCESS) {
    stats.mem_get_info++;
    if (free_bytes) *free_bytes = stats.total_bytes - stats.live_bytes;
    if (total_bytes) *total_bytes = stats.total_bytes;
  }
  unlock_fake();
  return r;
}

/* cuMemAlloc memory: exactly the requested bytes (not the rounded
 * mapping); VM memory: the mapped chunk; imports: the handle's size. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  struct region r;
  lock_fake();
  int found = find_region(p, &r);
  unlock_fake();
  if (!found) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = r.base;
  if (size) *size = r.size;
  return CUDA_SUCCESS;
}

/* ---------------- pointer attributes ---------------- */

/* One attribute of live memory (lock held).  `plural`: as
 * cuPointerGetAttributes answers, which differs on HOST_POINTER (NULL,
 * success) and P2P_TOKENS (refused). */
static CUresult attr_live(const struct region* r, CUdeviceptr p, CUpointer_attribute a, void* data, int plural) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = r->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned*)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!plural) return CUDA_ERROR_INVALID_VALUE;
      *(void**)data = NULL;
      break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: {
      if (plural) return CUDA_ERROR_INVALID_VALUE;
      CUDA_POINTER_ATTRIBUTE_P2P_TOKENS t = {0, 0xfe00};
      memcpy(data, &t, sizeof t);
      *r->sync_memops = 1;
      break;
    }
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned*)data = *r->sync_memops; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long*)data = r->buffer_id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = r->device; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned*)data = r->ipc_capable; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr*)data = r->range_start; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t*)data = r->range_size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned*)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long*)data = r->handle_types; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned*)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *(unsigned*)data = r->access; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t*)data = r->map_size; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void**)data = (void*)(uintptr_t)r->map_base; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long*)data = r->block_id; break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(unsigned*)data = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* cuPointerGetAttributes on memory the driver does not know: defaults,
 * the queried address as HOST_POINTER, RANGE_* left unwritten. */
static CUresult attr_unknown(CUdeviceptr p, CUpointer_attribute a, void* data) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void**)data = (void*)(uintptr_t)p; break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = -2; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void**)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(unsigned*)data = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* Unknown or freed memory: CUDA_ERROR_INVALID_VALUE, nothing written. */
EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  lock_fake();
  CUresult res = find_region(p, &r) ? attr_live(&r, p, a, data, 0) : CUDA_ERROR_INVALID_VALUE;
  unlock_fake();
  return res;
}

/* Stops at the first refused attribute (those before it stay written);
 * a NULL data[i] is skipped. */
EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr p) {
  if (n > 0 && (attrs == NULL || data == NULL)) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  lock_fake();
  int found = find_region(p, &r);
  CUresult res = CUDA_SUCCESS;
  for (unsigned i = 0; i < n && res == CUDA_SUCCESS; ++i)
    if (data[i] != NULL) res = found ? attr_live(&r, p, attrs[i], data[i], 1) : attr_unknown(p, attrs[i], data[i]);
  unlock_fake();
  return res;
}

/* Only SYNC_MEMOPS can be set, on live memory. */
EXPORT CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute a, CUdeviceptr p) {
  if (value == NULL || a != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  lock_fake();
  int found = find_region(p, &r);
  if (found) *r.sync_memops = *(const unsigned*)value != 0;
  unlock_fake();
  return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- IPC ----------------
 * The handle, as the real driver lays out the fields the shim relies on:
 *   [0,8)   the exporting context        [16,24) the requested size
 *   [24,28) the mapping's size / 4096    [28,32) the offset inside it
 *   [56,64) zero
 * and the fake's own fields in the rest:
 *   [8,12)  exporter pid   [12,16) its fd   [32,40) "fakeipc"
 *   [40,48) the allocation's buffer id   [48,56) zero
 * The importer maps the page-aligned part of the exporter's memfd (reached
 * through /proc/<pid>/fd/<fd>) that covers [offset, offset + size). */

struct ipc_fields {
  uint64_t ctx, size, buffer_id;
  uint32_t pid, fd, pages, offset;
};

static void put(unsigned char* h, int at, const void* v, size_t n) { memcpy(h + at, v, n); }
static void get(const unsigned char* h, int at, void* v, size_t n) { memcpy(v, h + at, n); }

static void encode_handle(unsigned char* h, const struct ipc_fields* f) {
  memset(h, 0, CU_IPC_HANDLE_SIZE);
  put(h, 0, &f->ctx, 8);
  put(h, 8, &f->pid, 4);
  put(h, 12, &f->fd, 4);
  put(h, 16, &f->size, 8);
  put(h, 24, &f->pages, 4);
  put(h, 28, &f->offset, 4);
  put(h, 32, ipc_magic, 8);
  put(h, 40, &f->buffer_id, 8);
}

static void decode_handle(const unsigned char* h, struct ipc_fields* f) {
  get(h, 0, &f->ctx, 8);
  get(h, 8, &f->pid, 4);
  get(h, 12, &f->fd, 4);
  get(h, 16, &f->size, 8);
  get(h, 24, &f->pages, 4);
  get(h, 28, &f->offset, 4);
  get(h, 40, &f->buffer_id, 8);
}

/* The whole allocation whatever pointer inside it names it; VM memory,
 * imports and unknown pointers are CUDA_ERROR_INVALID_VALUE. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  CUresult r = check_current();
  struct allocation* a = r == CUDA_SUCCESS ? find_allocation(p) : NULL;
  if (r == CUDA_SUCCESS && a == NULL) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct ipc_fields f = {(uint64_t)(uintptr_t)a->ctx, a->size, a->buffer_id,
                           (uint32_t)getpid(), (uint32_t)a->fd, (uint32_t)(a->mapping / PAGE), 0};
    encode_handle((unsigned char*)h->reserved, &f);
    stats.ipc_get++;
  }
  unlock_fake();
  return r;
}

/* The exporter's memfd, checked by name against the handle's buffer id
 * (the fd number may have been reused since); -1 when gone. */
static int open_exporter_fd(const struct ipc_fields* f) {
  char path[64], link[128], want[48];
  snprintf(path, sizeof path, "/proc/%u/fd/%u", f->pid, f->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  link[n > 0 ? n : 0] = 0;
  snprintf(want, sizeof want, "/memfd:");
  memfd_name(want + 7, sizeof want - 7, f->buffer_id);
  size_t len = strlen(want);
  if (strncmp(link, want, len) != 0 || (link[len] != 0 && link[len] != ' ')) {
    close(fd);
    return -1;
  }
  return fd;
}

static CUresult map_import(CUdeviceptr* out, const unsigned char* h, const struct ipc_fields* f) {
  int fd = open_exporter_fd(f);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  size_t start = f->offset / PAGE * PAGE;
  size_t len = round_up(f->offset + f->size, PAGE) - start;
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  struct import* m = calloc(1, sizeof *m);
  memcpy(m->handle, h, CU_IPC_HANDLE_SIZE);
  m->map = p;
  m->map_len = len;
  m->ptr = (CUdeviceptr)(uintptr_t)p + (f->offset - start);
  m->size = f->size;
  m->pid = (pid_t)f->pid;
  m->source_id = f->buffer_id;
  m->offset = f->offset;
  m->refs = 1;
  m->ctx = current;
  m->buffer_id = next_buffer_id++;
  m->next = imports;
  imports = m;
  *out = m->ptr;
  return CUDA_SUCCESS;
}

/* The same handle again: the same pointer, one more reference.  Another
 * handle overlapping an open part of the same exporter allocation:
 * CUDA_ERROR_ALREADY_MAPPED.  Own handles: CUDA_ERROR_INVALID_CONTEXT. */
static CUresult open_handle(CUdeviceptr* out, const unsigned char* h, unsigned flags) {
  CUresult r = check_current();
  if (r != CUDA_SUCCESS) return r;
  struct ipc_fields f;
  decode_handle(h, &f);
  if ((flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || memcmp(h + 32, ipc_magic, 8) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (f.pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t mapped = (uint64_t)f.pages * PAGE;
  if (f.size == 0 || f.size > mapped || f.offset > mapped - f.size) return CUDA_ERROR_INVALID_VALUE;
  for (struct import* m = imports; m; m = m->next)
    if (memcmp(m->handle, h, CU_IPC_HANDLE_SIZE) == 0) {
      m->refs++;
      *out = m->ptr;
      return CUDA_SUCCESS;
    }
  for (struct import* m = imports; m; m = m->next)
    if (m->pid == (pid_t)f.pid && m->source_id == f.buffer_id && f.offset < m->offset + m->size &&
        m->offset < f.offset + f.size)
      return CUDA_ERROR_ALREADY_MAPPED;
  return map_import(out, h, &f);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, CUipcMemHandle h, unsigned int flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  CUresult r = open_handle(out, (const unsigned char*)h.reserved, flags);
  if (r == CUDA_SUCCESS) stats.ipc_open++;
  else stats.ipc_open_refused++;
  unlock_fake();
  return r;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle h, unsigned int flags) {
  return cuIpcOpenMemHandle_v2(out, h, flags);
}

/* Drops one reference; the last unmaps. */
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  lock_fake();
  struct import** at = &imports;
  while (*at && (*at)->ptr != p) at = &(*at)->next;
  struct import* m = *at;
  if (m != NULL) {
    stats.ipc_close++;
    if (--m->refs == 0) {
      *at = m->next;
      munmap(m->map, m->map_len);
      free(m);
    }
  }
  unlock_fake();
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- virtual memory (expandable segments) ----------------
 * Reservations are PROT_NONE anonymous mappings; a physical allocation is a
 * memfd of its size; mapping puts the memfd at the reserved address, so
 * copies and memsets through the mapped range really reach memory.  The
 * created bytes count against the device total like cuMemAlloc's.
 * cuMemSetAccess records each device's flags per granule; the owning
 * device's flags set the host protection (read/write, read, none).
 * Mappings belong to the context current at cuMemMap: destroying it unmaps
 * them.  FAKE_CUDA_NO_POSIX_FD=1 makes cuMemCreate refuse shareable POSIX
 * fd handles (CUDA_ERROR_NOT_SUPPORTED), as drivers without them do. */

EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                              CUmemAllocationGranularity_flags option) {
  (void)prop;
  (void)option;
  if (g == NULL) return CUDA_ERROR_INVALID_VALUE;
  *g = VM_GRANULARITY;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  (void)align;
  (void)addr;
  (void)flags;
  if (ptr == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  /* Over-reserve by one granule so the range can start granule-aligned. */
  void* p = mmap(NULL, size + VM_GRANULARITY, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t a = ((uintptr_t)p + VM_GRANULARITY - 1) & ~(uintptr_t)(VM_GRANULARITY - 1);
  struct reservation* r = calloc(1, sizeof *r);
  r->base = (CUdeviceptr)a;
  r->size = size;
  lock_fake();
  r->next = reservations;
  reservations = r;
  stats.vm_reserve++;
  unlock_fake();
  *ptr = (CUdeviceptr)a;
  return CUDA_SUCCESS;
}

/* Forgets the mapping records inside [ptr, ptr + size) (lock held). */
static void forget_mappings(CUdeviceptr ptr, size_t size) {
  for (struct vm_mapping** p = &mappings; *p;) {
    struct vm_mapping* m = *p;
    if (m->ptr < ptr || m->ptr - ptr >= size) { p = &m->next; continue; }
    *p = m->next;
    free(m->access);
    free(m);
  }
}

/* Exactly a reservation (base and size). */
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  lock_fake();
  struct reservation** at = &reservations;
  while (*at && ((*at)->base != ptr || (*at)->size != size)) at = &(*at)->next;
  struct reservation* r = *at;
  if (r != NULL) {
    *at = r->next;
    free(r);
    forget_mappings(ptr, size);
    /* The granule of slack before or after stays mapped PROT_NONE: harmless. */
    munmap((void*)(uintptr_t)ptr, size);
    stats.vm_release_range++;
  }
  unlock_fake();
  return r != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                            unsigned long long flags) {
  (void)flags;
  if (handle == NULL || prop == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  init_once();
  CUresult r = CUDA_SUCCESS;
  if (prop->location.id < 0 || prop->location.id >= device_count) {
    r = CUDA_ERROR_INVALID_DEVICE;
  } else if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
             env_size("FAKE_CUDA_NO_POSIX_FD", 0)) {
    stats.vm_create_refused++;
    r = CUDA_ERROR_NOT_SUPPORTED;
  } else if (stats.live_bytes + size > stats.total_bytes) {
    stats.mem_alloc_failed++;
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = r == CUDA_SUCCESS ? memfd_create("fake-cuda-vm", MFD_CLOEXEC) : -1;
  if (r == CUDA_SUCCESS && (fd < 0 || ftruncate(fd, (off_t)size) != 0)) {
    if (fd >= 0) close(fd);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    struct physical* ph = calloc(1, sizeof *ph);
    *ph = (struct physical){fd, size, prop->location.id, next_buffer_id++, physicals};
    physicals = ph;
    stats.live_bytes += size;
    stats.vm_create++;
    /* The handle carries the fd and the size (sizes are multiples of 2 MiB). */
    *handle = ((CUmemGenericAllocationHandle)size) | (CUmemGenericAllocationHandle)fd;
  }
  unlock_fake();
  return r;
}

static int handle_fd(CUmemGenericAllocationHandle h) { return (int)(h & (VM_GRANULARITY - 1)); }
static size_t handle_size(CUmemGenericAllocationHandle h) { return (size_t)(h & ~(CUmemGenericAllocationHandle)(VM_GRANULARITY - 1)); }

static struct physical** find_physical(CUmemGenericAllocationHandle h) {
  struct physical** p = &physicals;
  while (*p && ((*p)->fd != handle_fd(h) || (*p)->size != handle_size(h))) p = &(*p)->next;
  return p;
}

/* Mappings keep the memory until unmapped. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  lock_fake();
  struct physical** at = find_physical(h);
  struct physical* ph = *at;
  if (ph != NULL) {
    *at = ph->next;
    close(ph->fd);
    stats.live_bytes -= ph->size;
    stats.vm_release++;
    free(ph);
  }
  unlock_fake();
  return ph != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Any mapping record (live or dead) overlapping [ptr, ptr + size). */
static int overlaps(const struct vm_mapping* m, CUdeviceptr ptr, size_t size) {
  return m->ptr < ptr + size && ptr < m->ptr + m->size;
}

static CUresult check_map(CUdeviceptr ptr, size_t size, size_t offset, struct physical* ph) {
  if (ph == NULL || size != ph->size || offset != 0 || ptr % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  struct reservation* r = find_reservation(ptr);
  if (r == NULL || ptr + size > r->base + r->size) return CUDA_ERROR_INVALID_VALUE;
  for (struct vm_mapping* m = mappings; m; m = m->next)
    if (!m->dead && overlaps(m, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  if (current != NULL && !current->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return CUDA_SUCCESS;
}

/* The whole physical allocation, at a granule inside a reservation, over
 * nothing mapped; no access until cuMemSetAccess. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
  (void)flags;
  lock_fake();
  struct physical* ph = *find_physical(h);
  CUresult r = check_map(ptr, size, offset, ph);
  void* p = MAP_FAILED;
  if (r == CUDA_SUCCESS) p = mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0);
  if (r == CUDA_SUCCESS && p == MAP_FAILED) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    forget_mappings(ptr, size); /* dead records of a destroyed context there */
    struct vm_mapping* m = calloc(1, sizeof *m);
    m->ptr = ptr;
    m->size = size;
    m->device = ph->device;
    m->ctx = current;
    m->handle = h;
    m->buffer_id = next_buffer_id++;
    m->block_id = ph->id + BLOCK_ID_BIAS;
    m->access = calloc(size / VM_GRANULARITY * MAX_DEVICES, 1);
    m->next = mappings;
    mappings = m;
    stats.vm_map++;
  }
  unlock_fake();
  return r;
}

/* A dead mapping record overlapping the range (lock held). */
static int touches_dead(CUdeviceptr ptr, size_t size) {
  for (struct vm_mapping* m = mappings; m; m = m->next)
    if (m->dead && overlaps(m, ptr, size)) return 1;
  return 0;
}

/* Every byte of [ptr, ptr + size) is in live mappings (lock held). */
static int fully_mapped(CUdeviceptr ptr, size_t size) {
  for (CUdeviceptr at = ptr; at < ptr + size;) {
    struct vm_mapping* m = find_mapping(at);
    if (m == NULL) return 0;
    at = m->ptr + m->size;
  }
  return 1;
}

static CUresult check_access_descs(const CUmemAccessDesc* desc, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static int host_prot(unsigned flags) {
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
         : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                      : PROT_NONE;
}

/* Records the descriptors on each granule of the range and protects it
 * as its owner may use it (lock held). */
static void apply_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  CUdeviceptr first = ptr / VM_GRANULARITY * VM_GRANULARITY;
  for (CUdeviceptr g = first; g < ptr + size; g += VM_GRANULARITY) {
    struct vm_mapping* m = find_mapping(g);
    unsigned char* flags = &m->access[(g - m->ptr) / VM_GRANULARITY * MAX_DEVICES];
    for (size_t i = 0; i < count; ++i) flags[desc[i].location.id] = (unsigned char)desc[i].flags;
    mprotect((void*)(uintptr_t)g, VM_GRANULARITY, host_prot(flags[m->device]));
  }
}

static int owner_of(CUdeviceptr p) {
  struct vm_mapping* m = find_mapping(p);
  return m ? m->device : -1;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (desc == NULL || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  CUresult r = check_access_descs(desc, count);
  if (r == CUDA_SUCCESS && touches_dead(ptr, size)) r = dead_call();
  if (r == CUDA_SUCCESS && !fully_mapped(ptr, size)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    int owner = owner_of(ptr);
    for (size_t i = 0; i < count; ++i)
      if (desc[i].location.id != owner) stats.set_access_peer++;
    apply_access(ptr, size, desc, count);
  }
  unlock_fake();
  return r;
}

/* Whole mappings only (one or more); their access is forgotten. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  lock_fake();
  CUresult r = touches_dead(ptr, size) ? dead_call() : CUDA_SUCCESS;
  int whole = 0;
  for (struct vm_mapping* m = mappings; r == CUDA_SUCCESS && m; m = m->next) {
    if (!overlaps(m, ptr, size)) continue;
    if (m->ptr < ptr || m->ptr + m->size > ptr + size) r = CUDA_ERROR_INVALID_VALUE;
    whole++;
  }
  if (r == CUDA_SUCCESS && whole == 0) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    forget_mappings(ptr, size);
    /* Back to reserved-but-inaccessible address space. */
    mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    stats.vm_unmap++;
  }
  unlock_fake();
  return r;
}

/* ---------------- copies and memsets ----------------
 * They run at once on the host: the fake has no real queue. */

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  (void)s;
  return cuMemcpyHtoD_v2(dst, src, n);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return cuMemcpyDtoH_v2(dst, src, n);
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  memset((void*)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  uint32_t* p = (uint32_t*)(uintptr_t)dst;
  for (size_t i = 0; i < n; ++i) p[i] = v;
  return CUDA_SUCCESS;
}

/* Between contexts (any two devices: no peer access needed). */
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  if (dst_ctx == NULL || src_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  lock_fake();
  int alive = dst_ctx->alive && src_ctx->alive;
  unlock_fake();
  if (!alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

/* ---------------- less common entry points ---------------- */

/* Green contexts: a handle and nothing behind it (the shim only warns). */
static int green_contexts;
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  (void)desc;
  (void)flags;
  if (out == NULL || dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_VALUE;
  *out = (CUgreenCtx)&green_contexts;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext* out) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  struct CUstream_st* st = resolve_stream(s, 0);
  *out = (st == &legacy_stream || st == &per_thread_stream) ? current : st->ctx;
  unlock_fake();
  return CUDA_SUCCESS;
}

/* Only cuMemMap'ed memory has an allocation handle. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
  if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  struct vm_mapping* m = find_mapping((CUdeviceptr)(uintptr_t)addr);
  if (m != NULL) *h = m->handle;
  unlock_fake();
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Memory pools: one default pool per device, nothing behind it. */
static int default_pools[MAX_DEVICES];
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice d) {
  if (pool == NULL || d < 0 || d >= device_count) return CUDA_ERROR_INVALID_VALUE;
  *pool = (CUmemoryPool)&default_pools[d];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
  return pool != NULL && d >= 0 && d < device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return pool != NULL && (map != NULL || count == 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* dma-buf: a duplicate of the allocation's memfd, which keeps its memory
 * alive after the free, as the real driver does while the fd is open. */
EXPORT CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                              unsigned long long flags) {
  (void)type;
  (void)flags;
  if (handle == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  struct allocation* a = find_allocation(dptr);
  int fd = -1;
  if (a != NULL && dptr + size <= (CUdeviceptr)(uintptr_t)a->ptr + a->size) fd = dup(a->fd);
  unlock_fake();
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  *(int*)handle = fd;
  return CUDA_SUCCESS;
}

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuCtxDetach: old, still callable */
EXPORT CUresult cuCtxDetach(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

/* ---------------- errors ---------------- */

static const struct { CUresult code; const char* name; const char* text; } error_table[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
  {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
  {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
  {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
  {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
  {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
  {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

static int find_error(CUresult e) {
  for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; ++i)
    if (error_table[i].code == e) return (int)i;
  return -1;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].name;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].text;
  return CUDA_SUCCESS;
}

/* ---------------- cuGetProcAddress ---------------- */

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status);
EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);

/* Base name -> implementation, first match wins: an entry applies from
 * `min_version` on, and ptsz entries only to per-thread lookups. */
struct proc_entry { const char* base; int min_version; int ptsz; const char* name; void* fn; };
#define PROC(base, ver, ptsz, fn) {base, ver, ptsz, #fn, (void*)fn}
static const struct proc_entry proc_table[] = {
  PROC("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
  PROC("cuGetProcAddress", 11030, 0, cuGetProcAddress),
  PROC("cuInit", 2000, 0, cuInit),
  PROC("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
  PROC("cuDeviceGet", 2000, 0, cuDeviceGet),
  PROC("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
  PROC("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
  PROC("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute),
  PROC("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
  PROC("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
  PROC("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease),
  PROC("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
  PROC("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset),
  PROC("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState),
  PROC("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
  PROC("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
  PROC("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
  PROC("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
  PROC("cuCtxCreate", 12050, 0, cuCtxCreate_v4),
  PROC("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
  PROC("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
  PROC("cuCtxDestroy", 2000, 0, cuCtxDestroy),
  PROC("cuCtxDetach", 2000, 0, cuCtxDetach),
  PROC("cuStreamGetCtx", 9020, 0, cuStreamGetCtx),
  PROC("cuGreenCtxCreate", 12040, 0, cuGreenCtxCreate),
  PROC("cuMemRetainAllocationHandle", 11000, 0, cuMemRetainAllocationHandle),
  PROC("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
  PROC("cuDeviceSetMemPool", 11020, 0, cuDeviceSetMemPool),
  PROC("cuMemPoolSetAccess", 11020, 0, cuMemPoolSetAccess),
  PROC("cuMemGetHandleForAddressRange", 11070, 0, cuMemGetHandleForAddressRange),
  PROC("cuCtxEnablePeerAccess", 4000, 0, cuCtxEnablePeerAccess),
  PROC("cuCtxDisablePeerAccess", 4000, 0, cuCtxDisablePeerAccess),
  PROC("cuStreamCreate", 2000, 0, cuStreamCreate),
  PROC("cuStreamCreateWithPriority", 5050, 0, cuStreamCreateWithPriority),
  PROC("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
  PROC("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz),
  PROC("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
  PROC("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz),
  PROC("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2),
  PROC("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz),
  PROC("cuStreamEndCapture", 10000, 0, cuStreamEndCapture),
  PROC("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz),
  PROC("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
  PROC("cuEventCreate", 2000, 0, cuEventCreate),
  PROC("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
  PROC("cuEventRecord", 2000, 0, cuEventRecord),
  PROC("cuEventQuery", 2000, 0, cuEventQuery),
  PROC("cuEventSynchronize", 2000, 0, cuEventSynchronize),
  PROC("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
  PROC("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
  PROC("cuMemFree", 3020, 0, cuMemFree_v2),
  PROC("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
  PROC("cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2),
  PROC("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
  PROC("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
  PROC("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
  PROC("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
  PROC("cuPointerGetAttribute", 4000, 0, cuPointerGetAttribute),
  PROC("cuPointerGetAttributes", 7000, 0, cuPointerGetAttributes),
  PROC("cuPointerSetAttribute", 6000, 0, cuPointerSetAttribute),
  PROC("cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle),
  PROC("cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2),
  PROC("cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle),
  PROC("cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle),
  PROC("cuMemGetAllocationGranularity", 10020, 0, cuMemGetAllocationGranularity),
  PROC("cuMemAddressReserve", 10020, 0, cuMemAddressReserve),
  PROC("cuMemAddressFree", 10020, 0, cuMemAddressFree),
  PROC("cuMemCreate", 10020, 0, cuMemCreate),
  PROC("cuMemRelease", 10020, 0, cuMemRelease),
  PROC("cuMemMap", 10020, 0, cuMemMap),
  PROC("cuMemUnmap", 10020, 0, cuMemUnmap),
  PROC("cuMemSetAccess", 10020, 0, cuMemSetAccess),
  PROC("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2),
  PROC("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2),
  PROC("cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2),
  PROC("cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2),
  PROC("cuMemcpyPeer", 4000, 0, cuMemcpyPeer),
  PROC("cuMemsetD8", 3020, 0, cuMemsetD8_v2),
  PROC("cuMemsetD32", 3020, 0, cuMemsetD32_v2),
  PROC("cuGetErrorName", 6000, 0, cuGetErrorName),
  PROC("cuGetErrorString", 6000, 0, cuGetErrorString),
};
#undef PROC
#define PROC_COUNT (sizeof proc_table / sizeof proc_table[0])

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.get_proc_address++;
  unlock_fake();
  int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  int known = 0;
  *pfn = NULL;
  for (size_t i = 0; i < PROC_COUNT; ++i) {
    if (strcmp(proc_table[i].base, symbol) != 0) continue;
    known = 1;
    if (version < proc_table[i].min_version || (proc_table[i].ptsz && !ptsz)) continue;
    *pfn = proc_table[i].fn;
    break;
  }
  if (status)
    *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                   : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* ---------------- test controls ---------------- */

EXPORT void fake_cuda_stats(struct fake_cuda_stats_t* out) {
  lock_fake();
  init_once();
  *out = stats;
  unlock_fake();
}

EXPORT void fake_cuda_hold_stream(CUstream s, int on) {
  lock_fake();
  struct CUstream_st* st = resolve_stream(s, 0);
  if (on) {
    st->held = 1;
  } else if (st->held) {
    st->held = 0;
    st->epoch++;
  }
  unlock_fake();
}

EXPORT void* fake_cuda_lookup_raw(const char* name) {
  for (size_t i = 0; i < PROC_COUNT; ++i)
    if (strcmp(proc_table[i].name, name) == 0) return proc_table[i].fn;
  return NULL;
}

EXPORT int fake_cuda_vm_access(CUdeviceptr ptr, int device) {
  lock_fake();
  struct vm_mapping* m = find_mapping(ptr);
  int flags = m == NULL ? -1 : device < 0 || device >= MAX_DEVICES ? 0 : (int)vm_flags(m, ptr, device);
  unlock_fake();
  return flags;
}

EXPORT size_t fake_cuda_live_imports(void) {
  size_t n = 0;
  lock_fake();
  for (struct import* m = imports; m; m = m->next) n++;
  unlock_fake();
  return n;
}
