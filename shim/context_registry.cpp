// context_registry.cpp — the per-context allocators and their stream sets.
#include "context_registry.h"

#include <algorithm>

#include "obs/process_observer.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<ContextState*> contexts;  // leaked on purpose (see header)
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// The last (context, state) this thread used: the common case needs no lock.
struct LastUsed {
  CUcontext ctx = nullptr;
  ContextState* state = nullptr;
};
thread_local LastUsed t_last;

ContextState* find_or_create(CUcontext ctx, const RealDriver* d) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (ContextState* s : r.contexts)
    if (s->context() == ctx) return s;
  CUdevice device = 0;
  if (d->cuCtxGetDevice(&device) != CUDA_SUCCESS) return nullptr;
  auto* state = new ContextState(ctx, device, d, config());
  r.contexts.push_back(state);
  return state;
}

}  // namespace

ContextState::ContextState(CUcontext ctx, CUdevice device, const RealDriver* driver, const Config& cfg)
    : ctx_(ctx), device_(device), backend_(driver, device, cfg.expandable_segments_handle_type) {
  std::size_t free_bytes = 0;
  if (driver->cuMemGetInfo_v2(&free_bytes, &device_total_) != CUDA_SUCCESS) device_total_ = 0;
  allocator_ = std::make_unique<CachingAllocator>(&backend_, cfg, device);
  allocator_->set_observer(&obs::ProcessObserver::instance());
}

void ContextState::note_stream(StreamId id, bool non_blocking) {
  if (id == kLegacyStreamId) return;
  multi_stream_.store(true, std::memory_order_relaxed);
  if (!non_blocking) return;
  std::lock_guard lock(mutex_);
  nonblocking_.insert(id);
  nonblocking_live_.store(nonblocking_.size(), std::memory_order_relaxed);
}

void ContextState::forget_stream(StreamId id) {
  std::lock_guard lock(mutex_);
  nonblocking_.erase(id);
  nonblocking_live_.store(nonblocking_.size(), std::memory_order_relaxed);
}

bool ContextState::defer_free(DevicePtr ptr) {
  std::lock_guard lock(mutex_);
  if (!deferred_.insert(ptr).second) return false;
  deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  return true;
}

std::vector<DevicePtr> ContextState::take_deferred() {
  std::lock_guard lock(mutex_);
  std::vector<DevicePtr> out(deferred_.begin(), deferred_.end());
  deferred_.clear();
  deferred_count_.store(0, std::memory_order_relaxed);
  return out;
}

void ContextState::retire_stream(StreamId id) {
  forget_stream(id);
  allocator_->retire_stream(id);
}

ContextState* current_context_state() {
  const RealDriver* d = real_driver();
  CUcontext ctx = nullptr;
  if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  if (t_last.ctx == ctx) [[likely]] return t_last.state;
  ContextState* state = find_or_create(ctx, d);
  if (state != nullptr) t_last = {ctx, state};
  return state;
}

// Rare path (frees of pointers the current context does not own): a lock
// and a scan over the contexts.
ContextState* find_owner(DevicePtr ptr) {
  for (ContextState* s : all_context_states())
    if (s->allocator().owns(ptr)) return s;
  return nullptr;
}

std::vector<ContextState*> all_context_states() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.contexts;
}

ContextGuard::ContextGuard(const RealDriver* d, CUcontext ctx) : d_(d) {
  if (d_->cuCtxGetCurrent(&previous_) != CUDA_SUCCESS) previous_ = nullptr;
  if (previous_ != ctx && d_->cuCtxSetCurrent(ctx) == CUDA_SUCCESS) switched_ = true;
}

ContextGuard::~ContextGuard() {
  if (switched_) d_->cuCtxSetCurrent(previous_);
}

}  // namespace cachalloc::shim
