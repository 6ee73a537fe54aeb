/* fake_state.h — what the fake libcuda.so.1's files share (internal).
 *
 * The fake driver (tests/fake/libcuda.so.1) is split by concept:
 *   fake_state.c     the global state, its lock, init, stream handles, context liveness
 *   fake_faults.c    fault injection (fake_cuda_fail, FAKE_CUDA_FAIL_RANDOM)
 *   fake_contexts.c  init, devices, contexts, primary contexts, peer access
 *   fake_streams.c   streams, capture, events
 *   fake_memory.c    cuMemAlloc/cuMemFree (+async), memory info, copies, memsets, pools
 *   fake_chunks.c    small cuMemAllocs share 2 MiB mappings (the driver's sub-allocation)
 *   fake_pointers.c  what a device pointer lies in: address ranges, pointer attributes
 *   fake_ipc.c       IPC handles, dma-buf
 *   fake_host.c      page-locked host memory (cuMemHostAlloc, cuMemHostRegister);
 *                    small allocations share 2 MiB chunks, as the driver's do
 *   fake_vm.c        virtual memory (reservations, cuMemCreate, maps, access)
 *   fake_graphs.c    graphs, executable graphs, capture modes and what they forbid
 *   fake_proc.c      cuGetProcAddress, error names, the test controls
 * Nothing here is exported: the library is built with hidden visibility and
 * only EXPORT symbols (the driver API and fake_cuda_*) leave it.  Every
 * entry point takes fake.lock; helpers noted "lock held" expect it taken. */
#ifndef CACHALLOC_FAKE_STATE_H
#define CACHALLOC_FAKE_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>
/* The fake defines the unversioned names too (cuda.h maps them to _v2). */
#undef cuGetProcAddress
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle

#include "fake_libcuda.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_INTERNAL __attribute__((visibility("hidden")))
#define MAX_DEVICES 4
#define MAX_DEPS 64
/* Pending work an event, a stream or a context waits for: `s`'s work up to
 * `epoch` (complete once s->epoch moved on).  Lists of them are appended to
 * by fake_deps_add (fake_streams.c), which never drops a pending one. */
struct CUstream_st;
struct fake_dep {
  struct CUstream_st* s;
  unsigned epoch;
};
#define MAX_PEERS 8
#define PAGE ((size_t)4096)
#define ALLOC_PAGE ((size_t)2 << 20) /* cuMemAlloc maps whole 2 MiB pages */
#define SUBALLOC_UNIT ((size_t)512)  /* placement granularity inside a shared mapping */
#define VM_GRANULARITY ((size_t)2 << 20)
#define FIRST_BUFFER_ID 1000ULL
#define BLOCK_ID_BIAS 1000000ULL     /* MEMORY_BLOCK_ID = a buffer id + this */

/* ---------------- driver objects ---------------- */

struct ctx_ref { struct CUctx_st* ctx; unsigned generation; };
struct CUctx_st {
  int device;
  int alive;            /* created, or a primary between retain and release/reset */
  unsigned generation;  /* new each time the context starts: stale objects show */
  int primary;
  int refcount;         /* primaries: retains not yet released */
  int npeers;           /* contexts whose memory this one may access */
  struct ctx_ref peers[MAX_PEERS];
  /* cuCtxWaitEvent: work enqueued afterwards on ANY of its streams (the
   * default streams, streams created later) waits for these too */
  int nwaits;
  struct fake_dep waits[MAX_DEPS];
};
struct CUstream_st {
  int held;                  /* work recorded now stays incomplete */
  unsigned epoch;            /* bumped whenever pending work completes */
  int launched;              /* a kernel was launched while held ... */
  unsigned launched_epoch;   /* ... at this epoch: running until it moves */
  int capturing;
  int capture_global;        /* the capture is in global mode */
  CUstreamCaptureMode capture_mode;
  pthread_t capture_thread;  /* the thread that began it */
  int capture_invalidated;   /* an unsafe call was made during it */
  int blocking;              /* orders against the legacy stream */
  struct CUstream_st* next;  /* registry of created streams */
  int dead;                  /* destroyed: the real driver may crash on it */
  struct CUctx_st* ctx;      /* owner (NULL for the default streams) */
  unsigned generation;
  /* cuStreamWaitEvent: work enqueued afterwards waits for these too */
  int nwaits;
  struct fake_dep waits[MAX_DEPS];
  struct CUstream_st* thread_next;  /* registry of threads' per-thread streams */
};
struct CUevent_st {
  int ndeps;
  struct fake_dep deps[MAX_DEPS];
  struct CUctx_st* ctx;
  unsigned generation;
  struct CUevent_st* next;   /* registry of live events (leak accounting) */
};
/* Graphs and executable graphs (fake_graphs.c): never freed, so that a
 * destroyed one is recognized (a call on it is CUDA_ERROR_INVALID_VALUE). */
struct CUgraph_st { int dead; };
struct CUgraphExec_st { int dead; };

/* A 2 MiB mapping that small cuMemAllocs share (fake_chunks.c). */
struct chunk {
  void* base;
  int fd;
  unsigned long long id;    /* the memfd's buffer id */
  struct CUctx_st* ctx;
  unsigned users;           /* allocations placed in it */
  unsigned char used[ALLOC_PAGE / SUBALLOC_UNIT / 8];  /* a bit per 512 B unit */
  struct chunk* next;
};

/* cuMemAlloc / cuMemAllocAsync memory. */
struct allocation {
  void* ptr;
  size_t size;      /* as requested */
  size_t rounded;   /* counted against the device total (512 B units) */
  size_t mapping;   /* the memfd's size: whole 2 MiB pages */
  size_t offset;    /* ptr's offset inside the memfd (0 unless in a chunk) */
  int fd;           /* the memfd, open while the allocation lives (IPC) */
  unsigned long long map_id;  /* the memfd's buffer id (buffer_id unless in a chunk) */
  struct chunk* chunk;        /* the shared mapping holding it, or NULL */
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

#define HOST_CHUNK ((size_t)2 << 20)  /* the chunks small pinned allocations share */

/* A 2 MiB chunk that consecutive small pinned allocations share
 * (fake_host.c).  Its flags are those of the allocation that created it:
 * cuMemHostGetFlags answers them for every allocation placed in it. */
struct host_chunk {
  void* base;
  unsigned flags;           /* the creating allocation's */
  struct CUctx_st* ctx;
  unsigned users;           /* allocations placed in it */
  unsigned char used[HOST_CHUNK / PAGE / 8];  /* a bit per 4 KiB page */
  struct host_chunk* next;
};

/* cuMemHostAlloc / cuMemAllocHost memory, and cuMemHostRegister'ed ranges. */
struct host_block {
  void* ptr;
  size_t size;      /* as requested (registered: the range) */
  unsigned flags;   /* as asked (registered: the registration's) */
  int registered;   /* the program's memory, pinned by cuMemHostRegister */
  struct host_chunk* chunk;  /* the chunk it was carved from, or NULL (its own memory) */
  struct CUctx_st* ctx;
  unsigned long long buffer_id;
  struct host_block* next;
};

/* Virtual memory: reservations, physical allocations, mappings. */
struct reservation { CUdeviceptr base; size_t size; struct reservation* next; };
struct physical { int fd; size_t size; int device; unsigned long long id; struct physical* next; };
struct vm_mapping {
  CUdeviceptr ptr;
  size_t size;
  int device;               /* where the physical memory lives */
  unsigned long long buffer_id, block_id;
  unsigned sync_memops;
  unsigned char* access;    /* [granule][device]: CUmemAccess_flags */
  CUmemGenericAllocationHandle handle;  /* what cuMemRetainAllocationHandle returns */
  struct vm_mapping* next;
};

/* ---------------- the driver's state ---------------- */

struct fake_driver {
  pthread_mutex_t lock;
  struct fake_cuda_stats_t stats;
  int initialized;
  int device_count;
  struct CUctx_st primary[MAX_DEVICES];
  unsigned generations;
  unsigned long long next_buffer_id;
  struct CUstream_st legacy_stream;
  struct CUstream_st* thread_streams; /* every thread's per-thread stream (never freed) */
  void (*on_begin_capture)(void*);    /* fake_cuda_on_begin_capture */
  void* on_begin_capture_arg;
  void (*on_mem_alloc)(void*);        /* fake_cuda_on_mem_alloc */
  void* on_mem_alloc_arg;
  struct CUstream_st* streams;   /* created streams, live */
  struct CUevent_st* events;     /* created events of live contexts */
  struct allocation* allocs;
  size_t nallocs, cap_allocs;
  struct chunk* chunks;          /* shared mappings of small allocations */
  struct import* imports;
  struct reservation* reservations;
  struct physical* physicals;
  struct vm_mapping* mappings;
  struct host_block* host_blocks;
  struct host_chunk* host_chunks;  /* shared chunks of small pinned allocations */
};
FAKE_INTERNAL extern struct fake_driver fake;
FAKE_INTERNAL extern __thread CUcontext fake_current;
/* cuCtxSetCurrent calls: counted outside `fake.stats` with atomics, since
 * cuCtxSetCurrent takes no lock (fake_cuda_stats loads it into the copy). */
FAKE_INTERNAL extern unsigned long fake_ctx_set_current_calls;
/* The calling thread's per-thread default stream (made on first use,
 * registered in fake.thread_streams, kept after the thread exits: the
 * legacy stream still orders against work left on it).  Lock held. */
FAKE_INTERNAL struct CUstream_st* fake_thread_stream(void);
/* The head of fake.thread_streams (linked through thread_next). */
FAKE_INTERNAL struct CUstream_st* fake_first_thread_stream(void);
FAKE_INTERNAL void fake_invalidate_global_captures(void);
/* A "potentially unsafe" call (cuMemAlloc, cuMemFree) now, from this
 * thread: 1 when a capture forbids it, which invalidates that capture, as
 * the driver does (fake_graphs.c; lock held). */
FAKE_INTERNAL int fake_capture_forbids_unsafe_call(void);
/* A new graph, as end-capture returns it (lock held). */
FAKE_INTERNAL struct CUgraph_st* fake_new_graph(void);
/* Whether a kernel launched on a held stream may still run (lock held). */
FAKE_INTERNAL int fake_kernels_in_flight(void);

/* ---------------- fake_state.c ---------------- */

FAKE_INTERNAL void fake_lock(void);
FAKE_INTERNAL void fake_unlock(void);
/* Reads the environment once (lock held). */
FAKE_INTERNAL void fake_init_once(void);
FAKE_INTERNAL size_t fake_env_size(const char* name, size_t def);
FAKE_INTERNAL size_t fake_round_up(size_t n, size_t to);
/* The stream a handle names: 0 is the legacy stream, or the per-thread
 * one for _ptsz entry points. */
FAKE_INTERNAL struct CUstream_st* fake_resolve_stream(CUstream s, int ptsz);
/* Work on stream `s` (a kernel, a copy): counted per stream kind, marked
 * running on a held stream (fake_streams.c). */
FAKE_INTERNAL CUresult fake_launch(CUstream s, int ptsz);
/* An object made in context `c` at `generation` is still usable. */
FAKE_INTERNAL int fake_ctx_live(const struct CUctx_st* c, unsigned generation);
/* The calling thread's context can be used (lock held). */
FAKE_INTERNAL CUresult fake_check_current(void);
/* A call naming an object of a destroyed context: counted (lock held). */
FAKE_INTERNAL CUresult fake_dead_call(void);

/* ---------------- fake_faults.c ---------------- */

/* The entry points that can be made to fail (fake_cuda_fail names them). */
enum fake_fault_point {
  FAULT_MEM_ALLOC,          /* cuMemAlloc_v2 */
  FAULT_MEM_ALLOC_ASYNC,    /* cuMemAllocAsync(_ptsz) */
  FAULT_EVENT_CREATE,
  FAULT_EVENT_RECORD,       /* cuEventRecord(_ptsz) */
  FAULT_EVENT_QUERY,
  FAULT_EVENT_SYNCHRONIZE,
  FAULT_CTX_SYNCHRONIZE,
  FAULT_STREAM_CREATE,      /* cuStreamCreate, cuStreamCreateWithPriority */
  FAULT_STREAM_QUERY,       /* cuStreamQuery(_ptsz) */
  FAULT_MEM_CREATE,
  FAULT_MEM_MAP,
  FAULT_MEM_SET_ACCESS,
  FAULT_MEM_ADDRESS_RESERVE,
  FAULT_MEM_HOST_ALLOC,     /* cuMemHostAlloc, cuMemAllocHost_v2 */
  FAULT_CTX_WAIT_EVENT,     /* cuCtxWaitEvent */
  FAULT_POINTS
};
/* CUDA_SUCCESS, or the error this call of `point` is to fail with (then
 * counted in failures_injected): the caller returns it having changed
 * nothing (lock held). */
FAKE_INTERNAL CUresult fake_fault(enum fake_fault_point point);

/* ---------------- fake_contexts.c ---------------- */

/* Synchronizing completes all work enqueued so far (lock held). */
FAKE_INTERNAL void fake_complete_all_streams(void);

/* ---------------- fake_streams.c ---------------- */

/* The context's streams and events die with it (lock held). */
FAKE_INTERNAL void fake_kill_streams_of(struct CUctx_st* c);
FAKE_INTERNAL void fake_forget_events_of(struct CUctx_st* c);

/* ---------------- fake_memory.c ---------------- */

/* The name of buffer `id`'s memfd (an importer checks it). */
FAKE_INTERNAL void fake_memfd_name(char* out, size_t n, unsigned long long id);
/* The cuMemAlloc allocation holding p, or NULL (lock held). */
FAKE_INTERNAL struct allocation* fake_find_allocation(CUdeviceptr p);
/* Frees allocation i (lock held). */
FAKE_INTERNAL void fake_free_allocation(size_t i);
/* A memfd named after buffer `id`, `len` bytes mapped shared; its fd in *fd. */
FAKE_INTERNAL void* fake_map_memfd(unsigned long long id, size_t len, int* fd);

/* ---------------- fake_chunks.c ---------------- */

/* The largest cuMemAlloc request placed in a shared mapping. */
FAKE_INTERNAL size_t fake_suballoc_max(void);
/* Places a (size, rounded, ctx filled) in a shared mapping: fills ptr,
 * mapping, offset, fd, map_id and chunk; 0 when no memory (lock held). */
FAKE_INTERNAL int fake_chunk_place(struct allocation* a);
/* Gives a's place back; the chunk goes with its last allocation (lock held). */
FAKE_INTERNAL void fake_chunk_release(struct allocation* a);

/* ---------------- fake_ipc.c ---------------- */

FAKE_INTERNAL struct import* fake_find_import(CUdeviceptr p);
/* Unmaps the context's imports (lock held). */
FAKE_INTERNAL void fake_drop_imports_of(struct CUctx_st* c);

/* ---------------- fake_host.c ---------------- */

/* The host block or registered range holding p, or NULL (lock held). */
FAKE_INTERNAL struct host_block* fake_find_host(uintptr_t p);
/* The context died: its pinned memory is freed, its registrations end
 * (lock held). */
FAKE_INTERNAL void fake_drop_host_of(struct CUctx_st* c);

/* ---------------- fake_vm.c ---------------- */

/* The VM mapping holding p, or NULL (lock held). */
FAKE_INTERNAL struct vm_mapping* fake_find_mapping(CUdeviceptr p);
FAKE_INTERNAL struct reservation* fake_find_reservation(CUdeviceptr p);
/* What cuMemSetAccess granted `device` at p inside m. */
FAKE_INTERNAL unsigned fake_vm_flags(const struct vm_mapping* m, CUdeviceptr p, int device);

#endif
