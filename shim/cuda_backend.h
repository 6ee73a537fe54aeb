// cuda_backend.h — the core's DeviceBackend on the real driver, one per context.
//
// After detach() (the context was destroyed) no method reaches the driver:
// each returns CUDA_ERROR_CONTEXT_IS_DESTROYED.
// Segments are cuMemAlloc_v2/cuMemFree_v2 of the REAL driver (never the
// shim's own exports); events are created with CU_EVENT_DISABLE_TIMING (the
// core pools them); the VM primitives serve expandable segments.  Calls are
// made with the owning context current (the shim guarantees it).
#pragma once

#include <atomic>
#include <vector>

#include "backend.h"
#include "config.h"
#include "real_driver.h"
#include "stream_set.h"

namespace cachalloc::shim {

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(const RealDriver* driver, CUdevice device, HandleType handle_type = HandleType::automatic)
      : d_(driver), device_(device), handle_type_(handle_type) {}

  Status segment_alloc(std::size_t size, DevicePtr* out) override;
  Status segment_free(DevicePtr ptr) override;
  Status mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  Status event_create(EventId* out) override;
  Status event_record(EventId event, StreamId stream) override;
  Status event_query(EventId event) override;
  Status event_synchronize(EventId event) override;
  Status event_destroy(EventId event) override;
  Status synchronize_device() override;
  // Work enqueued on `stream` later waits (on the device) for `event`
  // (stream_order.cpp).  kNotSupported when the driver lacks the call.
  Status stream_wait_event(StreamId stream, EventId event);
  // Cross-stream reuse (core/steal_path.cpp): cuEventRecord on the donor
  // stream and cuStreamWaitEvent on the requesting one, both under the
  // capture gate, refused (kNotReady) while any capture is in flight.
  // Another thread's per-thread stream, which this thread cannot name, is
  // covered by a context-wide event (cuCtxRecordEvent), else by a record
  // on the legacy stream (it orders after every blocking stream, per-thread
  // ones included); the plain-allocation pseudo-stream cannot be named
  // (kInvalidValue).
  Status order_streams(StreamId waiter, StreamId donor, EventId event, StreamId* unnamed) override;
  Status mark_stream(EventId event, StreamId stream) override;
  Status wait_event(StreamId waiter, EventId event) override;

  // A fence is one event that captures all the context's work enqueued so
  // far (cuCtxRecordEvent, CUDA 12.5), or, where the driver lacks or refuses
  // it, one event on the legacy stream plus one on each busy stream of
  // `streams` (stream_set.h), recorded under that set's lock.  Refused
  // (kNotReady) while a graph capture is in flight, where either record
  // would join or invalidate it.  Fences and their events are pooled: a
  // fence costs its event records, nothing else.  Only the allocator calls
  // these, under its lock.
  Status fence_record(FenceId* out, FenceCost* cost) override;
  Status fence_query(FenceId fence) override;
  Status fence_synchronize(FenceId fence) override;
  void fence_destroy(FenceId fence) override;
  // All work the context enqueues from now on, on any stream, waits (on the
  // device) for each of the fence's events: cuCtxWaitEvent (CUDA 12.5),
  // measured on an H100 to order later work on non-blocking streams created
  // before and after it, the legacy, blocking and per-thread streams and
  // other threads' streams.  Refused during a capture, as fence_record.
  Status fence_join(FenceId fence) override;
  bool fence_join_supported() const override {
    return ctx_ != nullptr && d_->cuCtxWaitEvent != nullptr && !join_refused_;
  }
  void set_streams(const StreamSet* streams) { streams_ = streams; }
  // The context whose work a context-wide fence event captures.
  void set_context(CUcontext ctx) { ctx_ = ctx; }

  Status vm_granularity(std::size_t* out) override;
  Status vm_reserve(std::size_t size, DevicePtr* out) override;
  Status vm_release_range(DevicePtr base, std::size_t size) override;
  Status vm_create(std::size_t size, MemHandle* out) override;
  Status vm_release(MemHandle handle) override;
  Status vm_map(DevicePtr at, std::size_t size, MemHandle handle) override;
  Status vm_set_own_access(DevicePtr at, std::size_t size) override;
  Status vm_unmap(DevicePtr at, std::size_t size) override;
  Status vm_set_access(DevicePtr at, std::size_t size, int device, bool enable) override;

  // Pause backups: pinned host memory (the real cuMemHostAlloc, not the
  // shim's host cache) and copies on a non-blocking stream of our own.
  Status host_alloc(std::size_t size, void** out) override;
  void host_free(void* ptr) override;
  Status copy_to_host_async(void* dst, DevicePtr src, std::size_t size) override;
  Status copy_to_device_async(DevicePtr dst, const void* src, std::size_t size) override;
  Status copy_synchronize() override;

  // The context died (cuCtxDestroy, primary reset or last release): its
  // memory, events and streams went with it, so from now on every call
  // fails at once without reaching the driver.
  void detach() { detached_.store(true, std::memory_order_release); }

 private:
  struct Fence {
    std::vector<CUevent> events;  // created lazily, kept for reuse
    std::size_t used = 0;         // events recorded for this fence
    std::size_t done = 0;         // of those, known complete
  };
  bool record_on(Fence* f, CUstream stream);
  bool reserve_event(Fence* f);
  int record_context_wide(Fence* f);
  bool cover(Fence* f, CUstream stream, int* queries);
  Fence* take_fence();

  CUmemAllocationProp allocation_prop() const;
  CUmemAllocationHandleType requested_handle_type() const;
  bool detached() const { return detached_.load(std::memory_order_acquire); }

  const RealDriver* d_;
  CUdevice device_;
  HandleType handle_type_;
  // Set once cuMemCreate refused the requested shareable handle type.
  mutable bool plain_handles_ = false;
  std::atomic<bool> detached_{false};
  const StreamSet* streams_ = nullptr;
  CUcontext ctx_ = nullptr;
  // Set once the driver refused cuCtxRecordEvent for a reason other than a
  // capture: fences record per stream from then on.
  bool context_wide_refused_ = false;
  // Set once the driver refused cuCtxWaitEvent for a reason other than a
  // capture: misses wait for fences on the host from then on.
  bool join_refused_ = false;
  Status copy_stream(CUstream* out);
  CUstream copy_stream_ = nullptr;  // created at the first backup, never destroyed (exit safety)
  std::vector<Fence*> spare_fences_;  // never freed: the process may exit with the driver gone
};

}  // namespace cachalloc::shim
