// cuda_backend.cpp — DeviceBackend primitives as real driver calls.
#include "cuda_backend.h"

#include "log.h"

#include "backend_call.h"
#include "capture_tracking.h"
#include "fresh_pinned.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {
namespace {

// Every driver call the cache makes is a CALL (backend_call.h).
constexpr Status kContextDestroyed = CUDA_ERROR_CONTEXT_IS_DESTROYED;
CUevent as_event(EventId e) { return reinterpret_cast<CUevent>(e); }

}  // namespace

Status CudaBackend::segment_alloc(std::size_t size, DevicePtr* out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  CUdeviceptr p = 0;
  CUresult r = CALL(cuMemAlloc_v2, &p, size);
  if (r == CUDA_SUCCESS) *out = static_cast<DevicePtr>(p);
  return status(r);
}

Status CudaBackend::segment_free(DevicePtr ptr) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  return status(CALL(cuMemFree_v2, static_cast<CUdeviceptr>(ptr)));
}

Status CudaBackend::mem_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  return status(CALL(cuMemGetInfo_v2, free_bytes, total_bytes));
}

Status CudaBackend::event_create(EventId* out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  CUevent e = nullptr;
  CUresult r = CALL(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) *out = reinterpret_cast<EventId>(e);
  return status(r);
}

// Another thread's per-thread stream cannot be named from here: the core
// then falls back to synchronize_device().
Status CudaBackend::event_record(EventId event, StreamId stream) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  CUstream s = nullptr;
  if (!to_cu_stream(stream, &s)) return kInvalidValue;
  if (obs::logger().should_log(LogLevel::trace))
    obs::logger().trace("record event {} on stream {}", static_cast<const void*>(as_event(event)),
                        static_cast<const void*>(s));
  return status(CALL(cuEventRecord, as_event(event), s));
}

// cuEventQuery is an unsafe call during a global/thread-local capture (it
// would invalidate the capture): report "not ready" and let the block wait.
Status CudaBackend::event_query(EventId event) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  std::shared_lock gate(capture_gate());
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  return status(CALL(cuEventQuery, as_event(event)));
}

Status CudaBackend::event_synchronize(EventId event) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  return status(CALL(cuEventSynchronize, as_event(event)));
}

Status CudaBackend::event_destroy(EventId event) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  return status(CALL(cuEventDestroy_v2, as_event(event)));
}

// cuCtxSynchronize would invalidate a global or thread-local capture: "not
// ready" instead, and what waited on it stays parked (or mapped).  (No gate
// here, as in fence_synchronize: record_serial_end calls this holding it.)
Status CudaBackend::synchronize_device() {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  return status(CALL(cuCtxSynchronize));
}

Status CudaBackend::stream_wait_event(StreamId stream, EventId event) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  CUstream s = nullptr;
  if (d_->cuStreamWaitEvent == nullptr) return kNotSupported;
  if (!to_cu_stream(stream, &s)) return kInvalidValue;
  return status(CALL(cuStreamWaitEvent, s, as_event(event), 0));
}

// Another thread's per-thread stream cannot be named from this thread: one
// event for all the context's work (cuCtxRecordEvent) covers it, else an
// event on the legacy stream, which orders after every blocking stream,
// per-thread ones included.  The context-wide event first: a record on the
// legacy stream also makes every blocking stream's later work wait for it,
// on the device (the legacy stream's implicit synchronization).
Status CudaBackend::order_streams(StreamId waiter, StreamId donor, EventId event, StreamId* unnamed) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuStreamWaitEvent == nullptr) return kNotSupported;
  CUstream w = nullptr, d = nullptr;
  if (!to_cu_stream(waiter, &w)) return *unnamed = waiter, kInvalidValue;
  const bool named = to_cu_stream(donor, &d);
  if (!named && !is_per_thread_id(donor)) return *unnamed = donor, kInvalidValue;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (!named && ctx_ != nullptr && d_->cuCtxRecordEvent != nullptr && !context_wide_refused_)
    r = CALL(cuCtxRecordEvent, ctx_, as_event(event));
  if (r != CUDA_SUCCESS) r = CALL(cuEventRecord, as_event(event), named ? d : CU_STREAM_LEGACY);
  if (r != CUDA_SUCCESS) return status(r);
  return status(CALL(cuStreamWaitEvent, w, as_event(event), 0));
}

// A steal's progress mark (core/steal_path.cpp): a plain record, refused
// during a capture as order_streams is (a record on a capturing stream
// would join the capture).  Another thread's per-thread stream cannot be
// named: kInvalidValue, and the core records no mark there.
Status CudaBackend::mark_stream(EventId event, StreamId stream) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  CUstream s = nullptr;
  if (!to_cu_stream(stream, &s)) return kInvalidValue;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  return status(CALL(cuEventRecord, as_event(event), s));
}

// A wait on a mark recorded earlier (core/steal_path.cpp, wait_on_mark):
// refused as order_streams is, for the waiter.
Status CudaBackend::wait_event(StreamId waiter, EventId event) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuStreamWaitEvent == nullptr) return kNotSupported;
  CUstream w = nullptr;
  if (!to_cu_stream(waiter, &w)) return kInvalidValue;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  return status(CALL(cuStreamWaitEvent, w, as_event(event), 0));
}

CudaBackend::Fence* CudaBackend::take_fence() {
  if (spare_fences_.empty()) return new Fence;
  Fence* f = spare_fences_.back();
  spare_fences_.pop_back();
  return f;
}

// The fence's next event, created when the pooled fence has none left.
bool CudaBackend::reserve_event(Fence* f) {
  if (f->used < f->events.size()) return true;
  CUevent e = nullptr;
  if (CALL(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
  f->events.push_back(e);
  return true;
}

// Records the fence's next event on `stream`.
bool CudaBackend::record_on(Fence* f, CUstream stream) {
  if (!reserve_event(f) || CALL(cuEventRecord, f->events[f->used], stream) != CUDA_SUCCESS) return false;
  ++f->used;
  return true;
}

// One event for all the context's streams (non-blocking ones, every
// thread's per-thread stream, green contexts' on a primary): no query per
// stream, one record per fence.  1 recorded, 0 not available (the caller
// records per stream), -1 failed.  A capture the hooks did not see makes the
// driver refuse it (and invalidates that capture, as a legacy-stream event
// would): that fence fails, later ones try again.
int CudaBackend::record_context_wide(Fence* f) {
  if (ctx_ == nullptr || d_->cuCtxRecordEvent == nullptr || context_wide_refused_) return 0;
  if (!reserve_event(f)) return -1;
  const CUresult r = CALL(cuCtxRecordEvent, ctx_, f->events[f->used]);
  if (r == CUDA_SUCCESS) {
    ++f->used;
    return 1;
  }
  if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) return -1;
  context_wide_refused_ = true;
  obs::logger().info("device {}: cuCtxRecordEvent refused (error {}); fences record one event per busy stream",
                     device_, static_cast<int>(r));
  return 0;
}

// A stream whose work has all completed needs no event: nothing enqueued on
// it before the fence can still touch a block freed before the fence (work
// enqueued later on a freed block is the program's use after free).  One
// query instead of an event and its later queries: PyTorch keeps ~128
// non-blocking streams alive and runs work on one or two of them.
bool CudaBackend::cover(Fence* f, CUstream stream, int* queries) {
  if (d_->cuStreamQuery != nullptr) {
    ++*queries;
    if (CALL(cuStreamQuery, stream) == CUDA_SUCCESS) return true;
  }
  return record_on(f, stream);  // busy, or the query failed: an event decides
}

Status CudaBackend::fence_record(FenceId* out, FenceCost* cost) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  Fence* f = take_fence();
  f->used = f->done = 0;
  if (const int wide = record_context_wide(f); wide != 0) {
    if (wide < 0) {
      spare_fences_.push_back(f);
      return CUDA_ERROR_UNKNOWN;
    }
    *out = reinterpret_cast<FenceId>(f);
    *cost = FenceCost{.events = 1, .stream_queries = 0};
    return kSuccess;
  }
  int queries = 0;
  bool ok = record_on(f, CU_STREAM_LEGACY);
  if (ok && streams_ != nullptr)
    ok = streams_->for_each_locked([&](StreamId id) {
      CUstream s = nullptr;
      return !to_cu_stream(id, &s) || cover(f, s, &queries);
    });
  if (!ok) {
    spare_fences_.push_back(f);
    return CUDA_ERROR_UNKNOWN;
  }
  *out = reinterpret_cast<FenceId>(f);
  *cost = FenceCost{.events = static_cast<int>(f->used), .stream_queries = queries};
  return kSuccess;
}

// Events complete in record order on each stream, but a fence spans
// several: the ones already seen complete are not asked again.
Status CudaBackend::fence_query(FenceId fence) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  std::shared_lock gate(capture_gate());
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  auto* f = reinterpret_cast<Fence*>(fence);
  while (f->done < f->used) {
    const CUresult r = CALL(cuEventQuery, f->events[f->done]);
    if (r != CUDA_SUCCESS) return status(r);
    ++f->done;
  }
  return kSuccess;
}

Status CudaBackend::fence_synchronize(FenceId fence) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  // cuEventSynchronize would invalidate a global or thread-local capture.
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  auto* f = reinterpret_cast<Fence*>(fence);
  while (f->done < f->used) {
    const CUresult r = CALL(cuEventSynchronize, f->events[f->done]);
    if (r != CUDA_SUCCESS) return status(r);
    ++f->done;
  }
  return kSuccess;
}

void CudaBackend::fence_destroy(FenceId fence) { spare_fences_.push_back(reinterpret_cast<Fence*>(fence)); }

// A fence's events stay recorded until it is destroyed, and a wait orders
// after the record the event had when the wait was made: destroying the
// fence (re-recording its pooled events later) right after the join is safe.
Status CudaBackend::fence_join(FenceId fence) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (!fence_join_supported()) return kNotSupported;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  auto* f = reinterpret_cast<Fence*>(fence);
  for (std::size_t i = f->done; i < f->used; ++i) {
    const CUresult r = CALL(cuCtxWaitEvent, ctx_, f->events[i]);
    if (r == CUDA_SUCCESS) continue;
    if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) return kNotReady;
    join_refused_ = true;
    obs::logger().info("device {}: cuCtxWaitEvent refused (error {}); misses wait for fences on the host", device_,
                       static_cast<int>(r));
    return kNotSupported;
  }
  return kSuccess;
}

// expandable_segments_handle_type: `auto` asks for POSIX file descriptors
// (shareable with other processes, as PyTorch does) and falls back to plain
// handles where the driver refuses them; `posix_fd`, `fabric` and `none`
// ask for exactly that.
CUmemAllocationHandleType CudaBackend::requested_handle_type() const {
  switch (handle_type_) {
    case HandleType::none: return CU_MEM_HANDLE_TYPE_NONE;
    case HandleType::fabric: return CU_MEM_HANDLE_TYPE_FABRIC;
    case HandleType::posix_fd: return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case HandleType::automatic: break;
  }
  return plain_handles_ ? CU_MEM_HANDLE_TYPE_NONE : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

CUmemAllocationProp CudaBackend::allocation_prop() const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = requested_handle_type();
  return prop;
}

Status CudaBackend::vm_granularity(std::size_t* out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemGetAllocationGranularity == nullptr) return kNotSupported;
  CUmemAllocationProp prop = allocation_prop();
  return status(CALL(cuMemGetAllocationGranularity, out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

Status CudaBackend::vm_reserve(std::size_t size, DevicePtr* out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemAddressReserve == nullptr) return kNotSupported;
  CUdeviceptr p = 0;
  CUresult r = CALL(cuMemAddressReserve, &p, size, 0, 0, 0);
  if (r == CUDA_SUCCESS) *out = static_cast<DevicePtr>(p);
  return status(r);
}

Status CudaBackend::vm_release_range(DevicePtr base, std::size_t size) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemAddressFree == nullptr) return kNotSupported;
  return status(CALL(cuMemAddressFree, static_cast<CUdeviceptr>(base), size));
}

Status CudaBackend::vm_create(std::size_t size, MemHandle* out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemCreate == nullptr) return kNotSupported;
  CUmemAllocationProp prop = allocation_prop();
  CUmemGenericAllocationHandle h = 0;
  CUresult r = CALL(cuMemCreate, &h, size, &prop, 0);
  if ((r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) && handle_type_ == HandleType::automatic &&
      !plain_handles_) {
    plain_handles_ = true;  // this driver or device cannot share: plain handles from now on
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    r = CALL(cuMemCreate, &h, size, &prop, 0);
  }
  if (r == CUDA_SUCCESS) *out = static_cast<MemHandle>(h);
  return status(r);
}

Status CudaBackend::vm_release(MemHandle handle) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemRelease == nullptr) return kNotSupported;
  return status(CALL(cuMemRelease, static_cast<CUmemGenericAllocationHandle>(handle)));
}

Status CudaBackend::vm_map(DevicePtr at, std::size_t size, MemHandle handle) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemMap == nullptr || d_->cuMemSetAccess == nullptr) return kNotSupported;
  return status(CALL(cuMemMap, static_cast<CUdeviceptr>(at), size, 0, static_cast<CUmemGenericAllocationHandle>(handle), 0));
}

Status CudaBackend::vm_set_own_access(DevicePtr at, std::size_t size) {
  return vm_set_access(at, size, device_, true);
}

// Peer access: driver peer access does not cover cuMemMap'ed memory, so
// every peer device gets (or loses) access to the pages themselves.
Status CudaBackend::vm_set_access(DevicePtr at, std::size_t size, int device, bool enable) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemSetAccess == nullptr) return kNotSupported;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = enable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return status(CALL(cuMemSetAccess, static_cast<CUdeviceptr>(at), size, &access, 1));
}

Status CudaBackend::vm_unmap(DevicePtr at, std::size_t size) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemUnmap == nullptr) return kNotSupported;
  return status(CALL(cuMemUnmap, static_cast<CUdeviceptr>(at), size));
}

// ---- pause backups ----

// (fresh_pinned.h: large buffers populated by several threads, then registered)
Status CudaBackend::host_alloc(std::size_t size, void** out) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  DriverTimer timed(obs::DriverCall::cuMemHostAlloc);
  return status(fresh_pinned_alloc(d_, size, out));
}

void CudaBackend::host_free(void* ptr) {
  if (detached()) return;
  DriverTimer timed(obs::DriverCall::cuMemFreeHost);
  fresh_pinned_free(d_, ptr);
}

Status CudaBackend::copy_stream(CUstream* out) {
  if (copy_stream_ == nullptr) {
    if (d_->cuStreamCreate == nullptr) return kNotSupported;
    const CUresult r = CALL(cuStreamCreate, &copy_stream_, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
    if (r != CUDA_SUCCESS) return status(r);
  }
  *out = copy_stream_;
  return kSuccess;
}

Status CudaBackend::copy_to_host_async(void* dst, DevicePtr src, std::size_t size) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemcpyDtoHAsync_v2 == nullptr) return kNotSupported;
  CUstream s = nullptr;
  if (const Status st = copy_stream(&s); st != kSuccess) return st;
  return status(CALL(cuMemcpyDtoHAsync_v2, dst, static_cast<CUdeviceptr>(src), size, s));
}

Status CudaBackend::copy_to_device_async(DevicePtr dst, const void* src, std::size_t size) {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (d_->cuMemcpyHtoDAsync_v2 == nullptr) return kNotSupported;
  CUstream s = nullptr;
  if (const Status st = copy_stream(&s); st != kSuccess) return st;
  return status(CALL(cuMemcpyHtoDAsync_v2, static_cast<CUdeviceptr>(dst), src, size, s));
}

Status CudaBackend::copy_synchronize() {
  if (detached()) [[unlikely]] return kContextDestroyed;
  if (copy_stream_ == nullptr) return kSuccess;  // nothing was copied
  if (d_->cuStreamSynchronize == nullptr) return kNotSupported;
  return status(CALL(cuStreamSynchronize, copy_stream_));
}

}  // namespace cachalloc::shim
