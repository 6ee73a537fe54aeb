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
 *     means cachalloc is not loaded.
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
#define CACHALLOC_ERROR_OPERATING_SYSTEM 304 /* a file could not be written */
#define CACHALLOC_ERROR_ILLEGAL_STATE 401   /* cachalloc_validate: an invariant is violated */
#define CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED 900 /* not allowed while a graph capture is in flight */
#define CACHALLOC_ERROR_UNKNOWN 999         /* an internal error (never expected) */

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

#ifdef __cplusplus
}
#endif

#endif /* CACHALLOC_H */
