// context_registry.cpp — the per-context allocators, their stream sets, and
// what outlives a context (statistics) or spans two (peer access).
#include "context_registry.h"

#include <algorithm>

#include "log.h"
#include "obs/process_observer.h"
#include "process_state.h"
#include "stream_ids.h"
#include "tags.h"

namespace cachalloc::shim {
namespace {

// cuCtxEnablePeerAccess(peer) called in `accessor` (a context of `device`).
struct PeerGrant {
  CUcontext accessor;
  int device;
  CUcontext peer;
};

struct Registry {
  std::mutex mutex;
  std::vector<ContextState*> live;     // leaked on purpose (see header)
  std::vector<ContextState*> retired;  // destroyed contexts, kept for reports
  std::vector<PeerGrant> grants;
  unsigned next_index = 0;
  std::atomic<std::size_t> live_count{0};  // live.size(), readable without the lock
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

ContextState* live_state_locked(Registry& r, CUcontext ctx) {
  for (ContextState* s : r.live)
    if (s->context() == ctx) return s;
  return nullptr;
}

void set_peer(ContextState* owner, int device, bool enable) {
  const Status st = owner->allocator().set_peer_access(device, enable);
  if (st != kSuccess)
    obs::logger().error("cuMemSetAccess for peer device {} on device {}'s expandable segments failed (error {}): "
                        "kernels of device {} cannot reach that memory",
                        device, owner->device(), st, device);
}

// What a destroyed context leaves behind: expandable pages and reservations
// (not context memory) go back; blocks the program allocated with
// cuMemAllocAsync die here, where the driver's pool memory would not (said
// when `report_async`: the pluggable ABI's blocks, served for a stream
// too, are not cuMemAllocAsync memory, and its caller reports them).
void release_dead_context(ContextState* s, bool report_async) {
  CachingAllocator& a = s->allocator();
  if (const Status st = a.release_after_context_death(); st != kSuccess)
    obs::logger().error("context {} destroyed: releasing its expandable segments failed (error {}); their memory "
                        "stays reserved until the process ends",
                        static_cast<const void*>(s->context()), st);
  if (const std::size_t n = report_async ? a.live_blocks_on_streams_except(kUnorderedStreamId) : 0; n != 0)
    obs::logger().error("context {} destroyed with {} block(s) from cuMemAllocAsync/cudaMallocAsync still "
                        "allocated: the driver keeps stream-ordered pool memory alive after its context, cachalloc "
                        "cannot (its memory belonged to the context); do not use those pointers any more",
                        static_cast<const void*>(s->context()), n);
  s->retire();
}

// Whether device `device` still has a grant to `peer` other than `except`'s.
bool granted_elsewhere(const Registry& r, CUcontext peer, int device, CUcontext except) {
  return std::any_of(r.grants.begin(), r.grants.end(), [&](const PeerGrant& g) {
    return g.peer == peer && g.device == device && g.accessor != except;
  });
}

// A context usable for allocations: it has a device and answers
// cuMemGetInfo (a destroyed context still current after a reset does not).
ContextState* find_or_create(CUcontext ctx, const RealDriver* d, bool* created) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (ContextState* s = live_state_locked(r, ctx)) return s;
  CUdevice device = 0;
  std::size_t free_bytes = 0, total = 0;
  if (d->cuCtxGetDevice(&device) != CUDA_SUCCESS || d->cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS)
    return nullptr;
  auto* state = new ContextState(ctx, device, total, r.next_index++, d, config());
  *created = true;
  r.live.push_back(state);
  r.live_count.store(r.live.size(), std::memory_order_relaxed);
  for (const PeerGrant& g : r.grants)
    if (g.peer == ctx) set_peer(state, g.device, true);
  return state;
}

// Set once at start-up (set_context_creation_hooks); read at each creation.
struct CreationHooks {
  std::atomic<bool (*)() noexcept> start_outside_sequence{nullptr};
  std::atomic<void (*)() noexcept> created{nullptr};
};
constinit CreationHooks g_creation_hooks;

}  // namespace

void set_context_creation_hooks(const ContextCreationHooks& hooks) {
  g_creation_hooks.start_outside_sequence.store(hooks.start_outside_sequence, std::memory_order_release);
  g_creation_hooks.created.store(hooks.created, std::memory_order_release);
}

ContextState::ContextState(CUcontext ctx, CUdevice device, std::size_t device_total, unsigned index,
                           const RealDriver* driver, const Config& cfg)
    : ctx_(ctx),
      device_(device),
      device_total_(device_total),
      index_(index),
      free_sync_(cfg.free_sync),
      backend_(driver, device, cfg.expandable_segments_handle_type),
      order_(&backend_, cfg.free_sync, device, ctx) {
  backend_.set_streams(&order_.nonblocking());
  backend_.set_context(ctx);
  allocator_ = std::make_unique<CachingAllocator>(&backend_, cfg, device);
  allocator_->set_observer(&obs::ProcessObserver::instance());
  if (auto outside = g_creation_hooks.start_outside_sequence.load(std::memory_order_acquire);
      outside != nullptr && outside())
    order_.note_unseen_streams(true);
  apply_tag_settings(*allocator_);  // (cachalloc_set_memory_margin may come before any context)
}

void ContextState::retire() {
  backend_.detach();
  dead_.store(true, std::memory_order_release);
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
  order_.forget_stream(id);
  allocator_->retire_stream(id);
}

constinit thread_local detail::LastUsed detail::t_last;

// current_context_state() when `ctx` is not the one this thread used last.
// A context's first cache is also when objects loaded since the last look
// are read for unseen imports (the creation hooks, link_imports.h): rare,
// and before any of this context's blocks is handed out.
ContextState* detail::find_current_state(CUcontext ctx, const RealDriver* d) {
  bool created = false;
  ContextState* state = find_or_create(ctx, d, &created);
  if (state == nullptr) return nullptr;
  t_last = {ctx, state};
  if (created)
    if (auto hook = g_creation_hooks.created.load(std::memory_order_acquire); hook != nullptr) hook();
  return state;
}

ContextState* live_state_of(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return live_state_locked(r, ctx);
}

// Rare paths (frees of pointers the current context does not own, pointer
// queries): a lock and a scan over the live contexts.
ContextState* find_owner(DevicePtr ptr) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (ContextState* s : r.live)
    if (s->allocator().owns(ptr)) return s;
  return nullptr;
}

ContextState* find_owner(DevicePtr ptr, AddressInfo* info) {
  ContextState* current = current_context_state();
  if (current != nullptr && current->allocator().query(ptr, info) != kNotOwned) return current;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (ContextState* s : r.live)
    if (s != current && s->allocator().query(ptr, info) != kNotOwned) return s;
  return nullptr;
}

namespace {
ContextState* forget_context_locked(CUcontext ctx, bool report_async);
std::atomic<ContextRetiredFn> g_retired_listener{nullptr};
}  // namespace

void set_context_retired_listener(ContextRetiredFn fn) { g_retired_listener.store(fn, std::memory_order_release); }

// The listener (the pinned host blocks of the context) runs after the
// registry's lock is released: a host fence holds the host cache's lock
// and then asks for every context (host_ops.h).
ContextState* forget_context(CUcontext ctx, bool report_async) {
  ContextState* s = forget_context_locked(ctx, report_async);
  if (s != nullptr)
    if (const ContextRetiredFn listener = g_retired_listener.load(std::memory_order_acquire)) listener(s);
  return s;
}

namespace {
ContextState* forget_context_locked(CUcontext ctx, bool report_async) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  ContextState* s = live_state_locked(r, ctx);
  if (s != nullptr) {
    release_dead_context(s, report_async);
    std::erase(r.live, s);
    r.live_count.store(r.live.size(), std::memory_order_relaxed);
    r.retired.push_back(s);
    obs::logger().debug("context {} destroyed: its cache is dropped", static_cast<const void*>(ctx));
  }
  // Grants made from the dead context end with it (the driver drops its
  // peer access); grants to its memory have nothing left to cover.
  for (const PeerGrant& g : r.grants)
    if (g.accessor == ctx && !granted_elsewhere(r, g.peer, g.device, ctx))
      if (ContextState* owner = live_state_locked(r, g.peer)) set_peer(owner, g.device, false);
  std::erase_if(r.grants, [&](const PeerGrant& g) { return g.accessor == ctx || g.peer == ctx; });
  return s;
}
}  // namespace

void peer_access_enabled(CUcontext accessor, int accessor_device, CUcontext peer) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.grants.push_back({accessor, accessor_device, peer});
  if (ContextState* owner = live_state_locked(r, peer)) set_peer(owner, accessor_device, true);
}

void peer_access_disabled(CUcontext accessor, int accessor_device, CUcontext peer) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::erase_if(r.grants, [&](const PeerGrant& g) { return g.accessor == accessor && g.peer == peer; });
  if (!granted_elsewhere(r, peer, accessor_device, accessor))
    if (ContextState* owner = live_state_locked(r, peer)) set_peer(owner, accessor_device, false);
}

std::size_t live_context_count() { return registry().live_count.load(std::memory_order_relaxed); }

std::vector<ContextState*> live_context_states() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.live;
}

std::vector<ContextState*> all_context_states() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<ContextState*> out = r.retired;
  out.insert(out.end(), r.live.begin(), r.live.end());
  return out;
}

ContextGuard::ContextGuard(const RealDriver* d, CUcontext ctx) : d_(d) {
  if (d_->cuCtxGetCurrent(&previous_) != CUDA_SUCCESS) previous_ = nullptr;
  if (previous_ != ctx && d_->cuCtxSetCurrent(ctx) == CUDA_SUCCESS) switched_ = true;
}

ContextGuard::~ContextGuard() {
  if (switched_) d_->cuCtxSetCurrent(previous_);
}

}  // namespace cachalloc::shim
