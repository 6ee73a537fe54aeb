// cuda_host_backend.cpp — pinned allocations and cross-context host fences.
#include "cuda_host_backend.h"

#include "backend_call.h"
#include "capture_tracking.h"
#include "context_registry.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {

// Every driver call is a CALL (backend_call.h).

Status CudaHostBackend::host_alloc(std::size_t size, unsigned flags, void** out) {
  if (d_->cuMemHostAlloc == nullptr) return kNotSupported;
  return status(CALL(cuMemHostAlloc, out, size, flags));
}

Status CudaHostBackend::host_free(void* ptr) {
  if (d_->cuMemFreeHost == nullptr) return kNotSupported;
  return status(CALL(cuMemFreeHost, ptr));
}

// One event of `ctx` (current) recorded on `stream`, from the spares first.
bool CudaHostBackend::record(Fence* f, ContextState* ctx, CUstream stream) {
  CUevent e = nullptr;
  auto& spares = spare_events_[ctx];
  if (!spares.empty()) {
    e = spares.back();
    spares.pop_back();
  } else if (CALL(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    return false;
  }
  if (CALL(cuEventRecord, e, stream) != CUDA_SUCCESS) {
    spares.push_back(e);
    return false;
  }
  f->marks.push_back({ctx, e});
  return true;
}

// The legacy stream, then each busy non-blocking stream (an idle one has
// nothing enqueued that could still touch a block freed before now).
bool CudaHostBackend::cover_context(Fence* f, ContextState* ctx) {
  ContextGuard current(d_, ctx->context());
  if (!record(f, ctx, CU_STREAM_LEGACY)) return false;
  return ctx->nonblocking_streams().for_each_locked([&](StreamId id) {
    CUstream s = nullptr;
    if (!to_cu_stream(id, &s)) return true;
    if (d_->cuStreamQuery != nullptr && CALL(cuStreamQuery, s) == CUDA_SUCCESS) return true;
    return record(f, ctx, s);
  });
}

Status CudaHostBackend::fence_record(FenceId* out) {
  if (d_->cuEventCreate == nullptr || d_->cuEventRecord == nullptr || d_->cuEventQuery == nullptr)
    return kNotSupported;
  std::shared_lock gate(capture_gate());
  if (capture_in_flight()) [[unlikely]] return kNotReady;
  Fence* f = nullptr;
  if (!spare_fences_.empty()) {
    f = spare_fences_.back();
    spare_fences_.pop_back();
  } else {
    f = new Fence;
  }
  for (ContextState* ctx : all_context_states()) {
    if (!ctx->alive()) continue;
    if (!cover_context(f, ctx)) {
      fence_destroy(reinterpret_cast<FenceId>(f));
      return CUDA_ERROR_UNKNOWN;
    }
  }
  *out = reinterpret_cast<FenceId>(f);
  return kSuccess;
}

// A mark of a destroyed context is complete: its work died with it (and its
// event may not be touched).
Status CudaHostBackend::wait_marks(Fence* f, bool block) {
  while (f->done < f->marks.size()) {
    const Mark& m = f->marks[f->done];
    if (m.ctx->alive()) {
      const CUresult r = block ? CALL(cuEventSynchronize, m.event) : CALL(cuEventQuery, m.event);
      if (r != CUDA_SUCCESS) return status(r);
    }
    ++f->done;
  }
  return kSuccess;
}

Status CudaHostBackend::fence_query(FenceId fence) {
  std::shared_lock gate(capture_gate());
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  return wait_marks(reinterpret_cast<Fence*>(fence), false);
}

Status CudaHostBackend::fence_synchronize(FenceId fence) {
  if (strict_capture_in_flight()) [[unlikely]] return kNotReady;
  return wait_marks(reinterpret_cast<Fence*>(fence), true);
}

void CudaHostBackend::fence_destroy(FenceId fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  for (const Mark& m : f->marks)
    if (m.ctx->alive()) spare_events_[m.ctx].push_back(m.event);
  f->marks.clear();
  f->done = 0;
  spare_fences_.push_back(f);
}

}  // namespace cachalloc::shim
