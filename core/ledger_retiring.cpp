// ledger_retiring.cpp — release_remap's old addresses, waiting for their
// fence (ledger.h; the remap itself is remap_release.cpp's).
//
// A run mapped again at a grow's address stays mapped at its old one until
// a fence recorded before the remap completes: work enqueued before it may
// still use the old address.  The ledger keeps the runs and their fence,
// oldest first; the allocator unmaps a run once retired() hands it over
// (retire_remapped: the segments' pages and blocks are its business).
#include "caching_allocator.h"

namespace cachalloc {

RetiringRuns* Ledger::retired(bool wait) {
  if (retiring_.empty()) return nullptr;
  RetiringRuns& r = retiring_.front();
  const Status st = wait ? backend_->fence_synchronize(r.fence) : backend_->fence_query(r.fence);
  return st == kSuccess ? &r : nullptr;  // (not yet, or a failure: asked again later)
}

void Ledger::pop_retired() {
  backend_->fence_destroy(retiring_.front().fence);
  retiring_.pop_front();
}

}  // namespace cachalloc
