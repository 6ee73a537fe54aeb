// backend.h — the only door from the core to a device.
//
// Like mimalloc's prim.h or jemalloc's extent hooks: a handful of primitive
// operations the caching core needs, nothing else.  The shim implements it
// with the real driver (shim/cuda_backend.cpp); the tests implement it with
// host address ranges and scripted events (tests/fake/fake_backend.h).
// Every method returns a driver-numbered Status; none may throw.
#pragma once

#include <cstdint>
#include <string>

#include "types.h"

namespace cachalloc {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // Segments: one call each to the device's own allocator.
  virtual Status segment_alloc(std::size_t size, DevicePtr* out) = 0;
  virtual Status segment_free(DevicePtr ptr) = 0;
  virtual Status mem_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  // Events order reuse across streams.  event_query returns kSuccess once
  // all work recorded before the event has completed, kNotReady before.
  virtual Status event_create(EventId* out) = 0;
  virtual Status event_record(EventId event, StreamId stream) = 0;
  virtual Status event_query(EventId event) = 0;
  virtual Status event_synchronize(EventId event) = 0;
  virtual Status event_destroy(EventId event) = 0;
  // Waits for all work on the device context (cuCtxSynchronize): the safe
  // fallback when an event cannot be recorded.
  virtual Status synchronize_device() = 0;

  // Fences order the reuse of blocks freed without a stream (a plain
  // cuMemFree, which promises the memory is safe to reuse whatever any
  // stream does with it).  A fence completes once all work enqueued before
  // it, on every stream that may use the device's memory, has completed.
  // fence_record returns kSuccess (and in *cost the driver calls it made),
  // kNotReady when no fence can be recorded right now (a graph capture is in
  // flight: try again later), or an error.  The default is one event on the
  // legacy stream (StreamId 0), which orders after every blocking stream;
  // the shim covers each live non-blocking stream too: an event on a busy
  // one, nothing on an idle one (a stream query says so).
  struct FenceCost {
    int events = 0;          // events recorded
    int stream_queries = 0;  // streams asked whether they were idle
    int calls() const { return events + stream_queries; }
  };
  virtual Status fence_record(FenceId* out, FenceCost* cost);
  virtual Status fence_query(FenceId fence);        // kSuccess once complete, kNotReady before
  virtual Status fence_synchronize(FenceId fence);  // waits for it
  virtual void fence_destroy(FenceId fence);
  // Orders all work enqueued from now on, on every stream of the device
  // (streams created later included), after the fence: on the device, no
  // host wait (cuCtxWaitEvent).  Afterwards a block freed before the fence
  // may be handed out at once, whatever stream uses it next.  kNotSupported
  // where the device cannot (the default); kNotReady while a capture is in
  // flight.
  virtual Status fence_join(FenceId fence);
  virtual bool fence_join_supported() const { return false; }

  // Cross-stream reuse (core/steal_path.cpp): memory cached for one stream
  // handed to another without a host wait, as CUDA's stream-ordered pool
  // does.  Makes all work enqueued on `waiter` from now on wait, on the
  // device, for all work enqueued on `donor` so far: `event` (one of the
  // core's pooled events) is recorded on donor and waited for on waiter
  // (cuEventRecord + cuStreamWaitEvent).  A wait holds the record it saw,
  // so the event may be recorded again right after.  kNotReady while a
  // graph capture is in flight (a record could join the capture, a wait on
  // an event recorded outside it would break it); kInvalidValue, with
  // *unnamed set and nothing recorded, when a stream cannot be named
  // (waiter first); kNotSupported by default: no cross-stream reuse.
  virtual Status order_streams(StreamId waiter, StreamId donor, EventId event, StreamId* unnamed);
  // A progress mark for cross-stream reuse: records `event` on `stream`, so
  // that event_query later shows whether the device has run the stream up
  // to now.  The same refusals as order_streams (kNotReady during a
  // capture, kInvalidValue for a stream it cannot name, kNotSupported by
  // default).
  virtual Status mark_stream(EventId event, StreamId stream);
  // Makes all work enqueued on `waiter` from now on wait, on the device,
  // for `event`, a mark recorded earlier (mark_stream): cuStreamWaitEvent
  // alone.  The same refusals as order_streams, for the waiter.
  virtual Status wait_event(StreamId waiter, EventId event);

  // Virtual-memory primitives for expandable segments: reserve an address
  // range, create physical chunks, map/unmap them.  A mapping starts with no
  // access, as cuMemMap's does: vm_set_own_access grants this device
  // read/write access to a mapped range, which may span several mappings
  // (one call for a whole growth, as PyTorch's expandable segments make).
  virtual Status vm_granularity(std::size_t* out) = 0;
  virtual Status vm_reserve(std::size_t size, DevicePtr* out) = 0;
  virtual Status vm_release_range(DevicePtr base, std::size_t size) = 0;
  virtual Status vm_create(std::size_t size, MemHandle* out) = 0;
  virtual Status vm_release(MemHandle handle) = 0;
  virtual Status vm_map(DevicePtr at, std::size_t size, MemHandle handle) = 0;
  virtual Status vm_unmap(DevicePtr at, std::size_t size) = 0;
  virtual Status vm_set_own_access(DevicePtr at, std::size_t size) = 0;
  // Grants (enable) or revokes read/write access of another device to a
  // mapped range (peer access for expandable segments).
  virtual Status vm_set_access(DevicePtr at, std::size_t size, int device, bool enable) = 0;

  // Backups of paused tags (pause_path.cpp): pinned host memory, and copies
  // between it and the device on a stream of the backend's own, ordered
  // after nothing (the caller has synchronized the device first);
  // copy_synchronize waits for every copy issued.  kNotSupported by default.
  virtual Status host_alloc(std::size_t size, void** out);
  virtual void host_free(void* ptr);
  virtual Status copy_to_host_async(void* dst, DevicePtr src, std::size_t size);
  virtual Status copy_to_device_async(DevicePtr dst, const void* src, std::size_t size);
  virtual Status copy_synchronize();
  // Pageable host memory for BackupMode::pageable backups (backup_memory.cpp:
  // anonymous mmap, so the defaults serve every backend; the fake overrides
  // them to count and fail on cue).  pageable_free takes the size given.
  virtual Status pageable_alloc(std::size_t size, void** out);
  virtual void pageable_free(void* ptr, std::size_t size);

  // Disk backups of paused tags (backup_file.cpp; plain POSIX calls, so the
  // defaults serve every backend; the fake overrides them to fail on cue).
  // file_create makes a file in directory `dir` with room for `size` bytes:
  // with no name (name == nullptr: O_TMPFILE, or a name unlinked at once:
  // nothing stays on disk whatever happens to the process), or with one
  // (*name = its path, cachalloc-backup-PID-XXXXXX: visible to ls and du
  // until file_unlink, left behind if the process is killed);
  // file_write/file_read move all `size` bytes at `offset` or fail.
  // Failures answer kOperatingSystem and say why in *why (the path and the
  // system's words: "No space left on device", "short read").  file_close
  // gives the file and its space back (after file_unlink of a named one).
  virtual Status file_create(const char* dir, std::uint64_t size, int* fd, std::string* why, std::string* name);
  // file_open opens a named file again (read and write).
  virtual Status file_open(const std::string& path, int* fd, std::string* why);
  virtual void file_unlink(const std::string& path);
  virtual Status file_write(int fd, const void* src, std::size_t size, std::uint64_t offset, std::string* why);
  virtual Status file_read(int fd, void* dst, std::size_t size, std::uint64_t offset, std::string* why);
  virtual void file_close(int fd);
};

}  // namespace cachalloc
