/* cachalloc.h — the control API of libcachalloc.so, for programs that want to
 * talk to cachalloc while it serves their allocations.
 *
 * Reach it either way:
 *   - C/C++: include this header and link the installed library
 *     (-lcachalloc); run the program with libcachalloc.so preloaded as usual
 *     (the launcher does it), so the hooks and these functions are the same
 *     object.
 *   - Python (ctypes), or any program that should also run without
 *     cachalloc: look the symbols up at run time, e.g.
 *       lib = ctypes.CDLL(None)                      # the preloaded library
 *       if hasattr(lib, "cachalloc_empty_cache"): lib.cachalloc_empty_cache(0)
 *     or dlsym(RTLD_DEFAULT, "cachalloc_empty_cache") in C.  A missing symbol
 *     means cachalloc is not loaded.  python/cachalloc.py wraps this.
 *   - PyTorch's pluggable allocator (the second half of this header): the
 *     library is dlopen'ed by torch.cuda.memory.CUDAPluggableAllocator, not
 *     preloaded.  It then intercepts nothing else in the process (the hooks
 *     pass every call to the driver) and serves only cachalloc_malloc /
 *     cachalloc_free and these control functions.  Set CACHALLOC_INTERCEPT=1
 *     to make a dlopen'ed copy intercept anyway (it must have been loaded
 *     RTLD_GLOBAL for anything to reach its hooks), or CACHALLOC_INTERCEPT=0
 *     to make a preloaded copy leave the process's own allocations alone.
 *     Both preloaded and plugged in (from the same file, or another copy:
 *     the dlopen'ed one forwards to the preloaded one), one allocator per
 *     device context serves both, counted once.
 *
 * Every function is safe to call from any thread, at any time (also from a
 * thread with no CUDA context current), never throws, never aborts, and
 * returns an error code: 0 on success, otherwise a CUDA driver error code
 * (CUresult numbering; the values used are listed below).
 *
 * Until cachalloc has created its first cache (at the first allocation or
 * stream creation it sees in a context) every function returns
 * CACHALLOC_ERROR_NOT_INITIALIZED and does nothing: in particular it neither
 * loads nor initializes CUDA, and reads no configuration.  The same code
 * comes back where cachalloc passes every call to the driver (a bad
 * CACHALLOC_CONF, a child of fork()).  Once the process is exiting (atexit
 * handlers, static destructors), cachalloc_empty_cache and
 * cachalloc_record_stream return CACHALLOC_ERROR_DEINITIALIZED; the others
 * (they only read cachalloc's state) still work.
 *
 * `device` is a CUDA device ordinal (what cudaSetDevice takes), or -1 for
 * every device that has a cache.  A device's cache is that of each live
 * context of the device (the primary context for runtime programs).
 *
 * A context reset or destroyed (cudaDeviceReset, cuCtxDestroy) concurrently
 * with a call naming its device is a race like any CUDA call racing the reset:
 * order them in the program.
 */
#ifndef CACHALLOC_H
#define CACHALLOC_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes (the CUresult values of the same names). */
#define CACHALLOC_SUCCESS 0
#define CACHALLOC_ERROR_INVALID_VALUE 1     /* bad argument; buffer too small (cachalloc_stats_json) */
#define CACHALLOC_ERROR_OUT_OF_MEMORY 2     /* host memory for a report ran out */
#define CACHALLOC_ERROR_NOT_INITIALIZED 3   /* cachalloc is not active (see above) */
#define CACHALLOC_ERROR_DEINITIALIZED 4     /* the process is exiting */
#define CACHALLOC_ERROR_INVALID_DEVICE 101  /* no cache exists for that device */
#define CACHALLOC_ERROR_OPERATING_SYSTEM 304 /* a file could not be written (or read: a pause's backup file) */
#define CACHALLOC_ERROR_ILLEGAL_STATE 401   /* cachalloc_validate: an invariant is violated */
#define CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED 900 /* not allowed while a graph capture is in flight */
#define CACHALLOC_ERROR_UNKNOWN 999         /* an internal error (never expected) */

/* cachalloc's version, "MAJOR.MINOR.PATCH" (meson's project version; the
 * launcher's --version and the Python module's __version__ say the same).
 * Always available, before anything was served and while exiting; a static
 * string, never NULL. */
const char* cachalloc_version(void);

/* CUstream and cudaStream_t are both `struct CUstream_st*`: either can be
 * passed without a cast, and this header needs no CUDA header. */
struct CUstream_st;

/* Returns every cached block of `device` (-1: all devices) that no
 * allocation uses to the driver, as torch.cuda.empty_cache() does.  Waits for
 * the events that pending frees wait on first.  Runs with the owner context
 * made current (and the caller's restored).
 *   CACHALLOC_ERROR_INVALID_VALUE              device < -1
 *   CACHALLOC_ERROR_INVALID_DEVICE             no cache for that device
 *   CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED a global or thread-local mode
 *                                              capture is in flight (waiting
 *                                              and freeing would invalidate it) */
int cachalloc_empty_cache(int device);

/* The statistics dump as JSON text, NUL-terminated: exactly what
 * CACHALLOC_CONF=stats:PATH writes at exit (schema "version":1, one entry
 * per device context in "devices", with the torch.cuda.memory_stats() keys;
 * docs/OBSERVABILITY.md), taken now.
 *   buf, len    the caller's buffer and its size in bytes.
 * When the text and its NUL do not fit (or buf is NULL):
 * CACHALLOC_ERROR_INVALID_VALUE, and buf (when len > 0) holds the size
 * needed, NUL included, as decimal digits (truncated to fit; 21 bytes always
 * suffice).  cachalloc_stats_json_size() gives the same number.  The text
 * grows as the process makes calls, so allocate some headroom or retry. */
int cachalloc_stats_json(char* buf, size_t len);

/* *needed = the buffer size cachalloc_stats_json needs now, NUL included.
 *   CACHALLOC_ERROR_INVALID_VALUE  needed is NULL */
int cachalloc_stats_json_size(size_t* needed);

/* Resets the peak ("peak") values of every statistic of `device` (-1: all
 * devices) to the current ones, as torch.cuda.reset_peak_memory_stats().
 *   CACHALLOC_ERROR_INVALID_VALUE   device < -1
 *   CACHALLOC_ERROR_INVALID_DEVICE  no cache for that device */
int cachalloc_reset_peak_stats(int device);

/* Writes a snapshot of every segment and block of every device (the JSON of
 * CACHALLOC_CONF=snapshot:PATH) to `path` now, atomically (a temporary file
 * renamed over the target; a symbolic link as target is refused).  The
 * placeholders %p %h %r %d %% are expanded as in CACHALLOC_CONF.  path NULL
 * or "" means the configured snapshot path.
 *   CACHALLOC_ERROR_INVALID_VALUE     path NULL or "" and no snapshot path configured
 *   CACHALLOC_ERROR_OPERATING_SYSTEM  the file could not be written (a line on stderr says why) */
int cachalloc_snapshot(const char* path);

/* Marks the live block `ptr` as used on `stream` (torch's
 * Tensor.record_stream): whenever it is freed, on whatever stream, its memory
 * is reused only after the work enqueued on `stream` up to that free has
 * completed.  `stream` 0 is the legacy default stream, cudaStreamPerThread
 * (CU_STREAM_PER_THREAD) the calling thread's per-thread stream.  The stream
 * must stay alive until the block is freed.  Recording the block's own
 * allocation stream does nothing.
 *   CACHALLOC_ERROR_INVALID_VALUE  ptr is not the start of a live block served
 *                                  by cachalloc, or `stream` belongs to
 *                                  another context than the block */
int cachalloc_record_stream(void* ptr, struct CUstream_st* stream);

/* Runs the allocator's invariant checker on every live context's cache:
 * every segment and block is walked and every statistic recounted.  0 when
 * all invariants hold; otherwise CACHALLOC_ERROR_ILLEGAL_STATE with the first
 * violation's description copied into msg (NUL-terminated, truncated to
 * len; msg may be NULL when len is 0).  Costs a walk over all blocks under
 * each allocator's lock: for tests and debugging. */
int cachalloc_validate(char* msg, size_t len);

/* As cachalloc_reset_peak_stats, for the accumulated values ("allocated",
 * "freed" and the event counters), as torch.cuda.reset_accumulated_memory_stats(). */
int cachalloc_reset_accumulated_stats(int device);

/* torch.cuda.memory_summary()'s table for `device` (its live contexts), or
 * for -1 every device plus the interposer section: exactly what
 * CACHALLOC_CONF=stats:stderr prints at exit.  Same buffer protocol as
 * cachalloc_stats_json (too small: CACHALLOC_ERROR_INVALID_VALUE and the size
 * needed in buf as decimal digits).
 *   CACHALLOC_ERROR_INVALID_VALUE   device < -1, buffer too small
 *   CACHALLOC_ERROR_INVALID_DEVICE  no live cache for that device */
int cachalloc_summary(int device, char* buf, size_t len);

/* Caps what allocations through the pluggable ABI (cachalloc_malloc) may keep
 * reserved on `device` (-1: every device) at fraction * the device's total
 * memory, as torch.cuda.set_per_process_memory_fraction() does for PyTorch's
 * own allocator: past it the cache is emptied and the allocation retried,
 * then it fails.  1 removes the cap.  The CACHALLOC_CONF key
 * per_process_memory_fraction caps every allocation (hooks included) and
 * still applies.  May be called before cachalloc has served anything.
 *   CACHALLOC_ERROR_INVALID_VALUE    fraction not in (0, 1], device < -1
 *   CACHALLOC_ERROR_INVALID_DEVICE   device >= 64
 *   CACHALLOC_ERROR_NOT_INITIALIZED  cachalloc is disabled (bad CACHALLOC_CONF, fork child) */
int cachalloc_set_memory_fraction(double fraction, int device);

/* *fraction = the cap set by cachalloc_set_memory_fraction for `device`, or
 * else CACHALLOC_CONF's per_process_memory_fraction (1 before cachalloc has
 * read its configuration).
 *   CACHALLOC_ERROR_INVALID_VALUE   fraction NULL, device < 0
 *   CACHALLOC_ERROR_INVALID_DEVICE  device >= 64 */
int cachalloc_get_memory_fraction(int device, double* fraction);

/* The allocation `ptr` (a live block's start or any address inside it) lies
 * in, as the driver sees it: dlopen'ed (pluggable), the cachalloc segment
 * (one cuMemAlloc or expandable reservation holding many blocks) and its
 * size, as PyTorch's getBaseAllocation answers; preloaded, the block itself
 * and its requested size (the hooks present every block to the driver calls
 * that describe allocations as a cuMemAlloc of its own).  size may be NULL.
 *   CACHALLOC_ERROR_INVALID_VALUE  ptr or base NULL, ptr not inside a live block */
int cachalloc_get_base_allocation(void* ptr, void** base, size_t* size);

/* ------------------------------------------------------------------------
 * Tags, pause and resume (docs/PAUSE.md).
 *
 * Every allocation belongs to the tag current on its thread when it is made
 * (cachalloc_set_tag; else CACHALLOC_CONF "tag:NAME"; else untagged).  The
 * blocks of two tags never share a segment, and tagged memory always comes
 * from virtual reservations mapped page by page, so that a tag can give its
 * physical memory back and take it again at the same addresses.
 * Tag names: 1-63 characters among letters, digits, '_', '-', '.'.
 * ------------------------------------------------------------------------ */

/* Sets the calling thread's tag; NULL or "" = untagged.  Works before
 * cachalloc has served anything.
 *   CACHALLOC_ERROR_INVALID_VALUE  a bad name (nothing changes) */
int cachalloc_set_tag(const char* tag);
/* Copies the calling thread's tag ("" when untagged) into buf, NUL-terminated.
 *   CACHALLOC_ERROR_INVALID_VALUE  buf NULL or too small (truncated) */
int cachalloc_get_tag(char* buf, size_t len);
/* Where pause(tag) copies the tag's live blocks first, so that resume(tag)
 * restores them (CACHALLOC_BACKUP_NONE: their contents are lost, as with
 * torch_memory_saver without a backup):
 *   CACHALLOC_BACKUP_NONE (0)  no backup
 *   CACHALLOC_BACKUP_HOST (1)  one pinned host buffer of the tag's size
 *   CACHALLOC_BACKUP_DISK (2)  files in the backup directory (one nameless
 *                              file, or named ones: one per block;
 *                              CACHALLOC_CONF's pause_backup_dir, default
 *                              $TMPDIR, else /tmp, or
 *                              cachalloc_set_pause_backup_dir's), through
 *                              two pinned staging buffers of at most 64 MiB:
 *                              for tags larger than the host memory to spare.
 *                              Their failures (no directory, disk full, I/O
 *                              error) fail the pause with
 *                              CACHALLOC_ERROR_OPERATING_SYSTEM and an error
 *                              line saying why; the tag then runs on with its
 *                              contents.  The files are gone at the resume;
 *                              nameless ones also when the process ends,
 *                              however it ends.
 *   CACHALLOC_BACKUP_PAGEABLE (3) one pageable host buffer (an anonymous
 *                              mapping: nothing pinned, reclaimable by the
 *                              kernel; slower copies than pinned memory)
 * A host buffer (HOST, PAGEABLE) is given back at the resume unless the tag
 * retains it (cachalloc_set_tag_retain_backup).
 * Per tag; the last call wins (a backup taken is restored from where it was
 * taken); a tag's variants keep their own (cachalloc_set_tag_with_backup).
 * CACHALLOC_ERROR_INVALID_VALUE: a bad or NULL name, another mode. */
#define CACHALLOC_BACKUP_TAG (-1)
#define CACHALLOC_BACKUP_NONE 0
#define CACHALLOC_BACKUP_HOST 1
#define CACHALLOC_BACKUP_DISK 2
#define CACHALLOC_BACKUP_PAGEABLE 3
int cachalloc_set_tag_backup(const char* tag, int enable);
/* Pauses `tag` and its variants (cachalloc_set_tag_with_backup; NULL: every
 * tag but those cachalloc_set_tag_in_pause_all left out) in every device
 * context: synchronizes the
 * device, takes the backup if asked, then unmaps and releases every physical
 * page of the tag's segments, cached free blocks included; the addresses
 * stay reserved.  A name's tags are paused one after the other: on an error
 * those paused stay paused.  While paused, an allocation in the tag fails with
 * CUDA_ERROR_OUT_OF_MEMORY (and a warning naming the tag); freeing its
 * blocks works and touches no memory.  A second pause is a no-op (warning).
 * On error the tag is consistent (see docs/PAUSE.md) and nothing exits.
 *   CACHALLOC_ERROR_INVALID_VALUE              a bad name, or "" (untagged)
 *   CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED a capture is in flight
 *   CACHALLOC_ERROR_OPERATING_SYSTEM           a disk backup's file failed
 *   a driver error of the first context that failed */
int cachalloc_pause(const char* tag);
/* Maps new physical pages at every paused address of `tag` (NULL: as
 * cachalloc_pause) and restores the backup; a host backup's memory is then
 * given back unless the tag retains it (cachalloc_set_tag_retain_backup),
 * disk backup files removed.  A second resume is a no-op (warning).
 *   CACHALLOC_ERROR_OUT_OF_MEMORY  the device has not enough free memory:
 *                                  the tag stays paused, resumable later
 *   CACHALLOC_ERROR_OPERATING_SYSTEM reading a disk backup failed: the tag
 *                                  stays paused with its backup file
 *   (otherwise as cachalloc_pause) */
int cachalloc_resume(const char* tag);
/* 1 when `tag` is paused in some context, 0 when not, negative on a bad name. */
int cachalloc_tag_paused(const char* tag);

/* A backup mode per allocation (torch_memory_saver's regions decide it per
 * allocation; cachalloc_set_tag_backup per tag): sets the calling thread's
 * tag as cachalloc_set_tag does, with its allocations from now on backed up
 * as `backup` (CACHALLOC_BACKUP_NONE .. _PAGEABLE) whatever the tag's own
 * mode.  They go to a variant of the tag: a tag of its own, reported as
 * NAME+MODE ("weights+host"), paused, resumed and queried with the name.
 * CACHALLOC_BACKUP_TAG (-1): the tag's own mode (= cachalloc_set_tag).
 *   CACHALLOC_ERROR_INVALID_VALUE  a bad name, another mode, or a mode with
 *                                  NULL/"" (untagged) */
int cachalloc_set_tag_with_backup(const char* tag, int backup);
/* The calling thread's tag ("" untagged) as cachalloc_get_tag, and in
 * *backup its allocations' backup mode (CACHALLOC_BACKUP_TAG when the tag's
 * own), or CACHALLOC_TAG_PROCESS when the thread has set no tag (the
 * process's, CACHALLOC_CONF tag:, applies; buf names it).  What it answers
 * given back to cachalloc_set_tag_with_backup restores the thread's state
 * exactly: CACHALLOC_TAG_PROCESS there drops the thread's own tag (the name
 * is then ignored), so that the process's applies again, also once the
 * configuration is read (cachalloc_set_tag(NULL) would make it untagged).
 * CACHALLOC_ERROR_INVALID_VALUE: buf or backup NULL, buf too small. */
#define CACHALLOC_TAG_PROCESS (-2)
int cachalloc_get_tag_with_backup(char* buf, size_t len, int* backup);

/* Whether a host backup (HOST, PAGEABLE) of `tag` outlives its resume
 * (retain 1, the default: the next pause copies into it at the link's
 * speed) or is given back then (0: the process's host memory drops by the
 * backup, and the next pause allocates it again; torch_memory_saver's
 * default, which its drop-in sets unless TMS_RETAIN_CPU_BACKUP says
 * otherwise).  Read at each resume.  A retained backup
 * holds the contents of the last pause (cachalloc_get_backup_pointer) and
 * is refilled in place by the next pause; cachalloc_empty_cache gives back
 * one whose blocks were all freed.  tag NULL: every tag, those named later
 * too (each tag's own setting goes); torch_memory_saver's retain_cpu_backup.
 *   CACHALLOC_ERROR_INVALID_VALUE  a bad name or "", retain not 0 or 1 */
int cachalloc_set_tag_retain_backup(const char* tag, int retain);
/* 1 or 0 as set for `tag` (NULL: the default of every tag), negative on a
 * bad name. */
int cachalloc_get_tag_retain_backup(const char* tag);
/* *host = where a host backup holds the bytes [ptr, ptr+size) of a live
 * block now: while its tag is paused with a HOST or PAGEABLE backup, or
 * after the resume while the backup is retained; NULL (and success) when
 * none does (untagged memory, no backup, a disk backup, given back).  The
 * memory is cachalloc's: read it before the tag's next resume (or, retained,
 * its next pause); torch_memory_saver's get_cpu_backup.
 *   CACHALLOC_ERROR_INVALID_VALUE    host NULL, or the range is not inside
 *                                    one live block of cachalloc's
 *   CACHALLOC_ERROR_NOT_INITIALIZED  nothing served yet */
int cachalloc_get_backup_pointer(const void* ptr, size_t size, void** host);
/* Where the files of disk backups go from the next pause on: `dir` (NULL or
 * "": CACHALLOC_CONF's pause_backup_dir again), and whether they have names
 * there (named 1: one file per block, as torch_memory_saver keeps one per
 * allocation, cachalloc-backup-PID-XXXXXX, mode 0600, visible to ls and du
 * while the tag is paused, removed at its resume, left behind if the
 * process is killed; 0: one nameless file per tag, the default).  The directory must exist
 * at the pause (else the pause fails, as for pause_backup_dir).  Works
 * before cachalloc has served anything; torch_memory_saver's
 * set_disk_backup_dir.
 *   CACHALLOC_ERROR_INVALID_VALUE  named not 0 or 1 */
int cachalloc_set_pause_backup_dir(const char* dir, int named);
/* cachalloc_empty_cache for one tag (and its variants), every device: the
 * tag's cached free memory goes back to the device; other tags and
 * untagged memory keep their cache.  torch_memory_saver's disable() uses
 * it on the tag of its region when the region ends.
 *   CACHALLOC_ERROR_INVALID_VALUE              a bad name, NULL or ""
 *   CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED a capture is in flight */
int cachalloc_empty_tag_cache(const char* tag);
/* Whether cachalloc_pause(NULL) / cachalloc_resume(NULL) take `tag` (1, the
 * default) or leave it alone (0: it is paused only by name).
 *   CACHALLOC_ERROR_INVALID_VALUE  a bad name, NULL or "", not 0 or 1 */
int cachalloc_set_tag_in_pause_all(const char* tag, int included);
/* A tagged allocation that needs new device memory fails with
 * CUDA_ERROR_OUT_OF_MEMORY when the device would be left with less than
 * `bytes` free (after the usual release of cached memory and retry), on
 * every device; 0 (the default) removes the margin.  A block from the tag's
 * cache takes nothing from the device and is served.  Untagged allocations
 * have no margin.  torch_memory_saver's memory_margin_bytes. */
int cachalloc_set_memory_margin(size_t bytes);

/* ------------------------------------------------------------------------
 * PyTorch's pluggable allocator ABI.
 *
 *   import torch
 *   a = torch.cuda.memory.CUDAPluggableAllocator(
 *           "/path/libcachalloc.so", "cachalloc_malloc", "cachalloc_free")
 *   torch.cuda.memory.change_current_allocator(a)   # before any CUDA allocation
 *
 * or python/cachalloc.py's use_with_torch(), which also wires the hooks
 * below through the setters of torch._C._CUDAPluggableAllocator (record
 * stream, empty cache, memory fraction, base allocation).  Or, for one
 * region only: torch.cuda.MemPool(a.allocator()) with
 * torch.cuda.use_mem_pool (PyTorch's allocator then asks cachalloc for whole
 * segments).
 *
 * Allocations are served on `device`'s primary context (made current for
 * the call if another context is current, the caller's restored) from the
 * cache of that context, for `stream`, with PyTorch's stream order: a freed
 * block is reused at once on its own stream, on another only after events
 * on every stream it was recorded on (cachalloc_pluggable_record_stream)
 * have completed.  Frees may come from any thread, whatever its current
 * device.  While `stream` is being captured into a CUDA graph the cache is
 * bypassed (cuMemAlloc_v2) and frees wait until no capture is in flight:
 * PyTorch's graph pools are not available through this interface.
 * These functions never throw; failures return NULL (out of memory: the
 * OOM report is printed as for any allocation) or are logged.
 * ------------------------------------------------------------------------ */

/* size <= 0 returns NULL.  stream: a CUstream / cudaStream_t (0 = legacy). */
void* cachalloc_malloc(ssize_t size, int device, struct CUstream_st* stream);
/* ptr NULL does nothing; size is ignored; stream is the allocation's stream
 * (another stream is treated as a record_stream on it first). */
void cachalloc_free(void* ptr, ssize_t size, int device, struct CUstream_st* stream);
/* The hooks, with the signatures of CUDAPluggableAllocator's setters:
 *   set_init_fn            (torch calls it at creation, before a setter can run;
 *                           reads CACHALLOC_CONF and loads the driver early)
 *   set_reset_fn           torch.cuda.empty_cache(): every device
 *   set_memory_fraction_fn torch.cuda.set_per_process_memory_fraction()
 *   set_base_alloc_fn      getBaseAllocation (cachalloc_get_base_allocation;
 *                          returns ptr itself if it is not a live block)
 *   set_record_stream_fn   Tensor.record_stream() */
void cachalloc_pluggable_init(int device_count);
void cachalloc_pluggable_empty_cache(void);
void cachalloc_pluggable_set_memory_fraction(double fraction, int device);
void* cachalloc_pluggable_base_alloc(void* ptr, size_t* size);
void cachalloc_pluggable_record_stream(void* ptr, struct CUstream_st* stream);

#ifdef __cplusplus
}
#endif

#endif /* CACHALLOC_H */
