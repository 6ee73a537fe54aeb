// remap_release.cpp — release_remap: a grow past the mapped high-water
// mark takes free runs of other reservations without a host wait.
//
// release_before_peak gives free runs back before a grow would map more
// than the process ever had mapped; unmapping needs the device idle first
// (cuMemUnmap does not wait for kernels still using the pages), and that
// synchronization is what the setting costs in real programs
// (docs/BENCHMARKS.md section 5).  A physical allocation may be mapped at
// more than one address, so here the runs are not unmapped:
//
//   1. one context-wide fence is recorded and joined (fence_record,
//      fence_join: cuCtxWaitEvent), so all work enqueued from now on — the
//      grown block's first use included — runs after every use of the old
//      addresses, on the device, with no host wait;
//   2. each donor run's handle is mapped again at the grow's address, and
//      access granted there;
//   3. the donor's pages leave its segment (no handle, no block maps them)
//      and are marked retiring: the driver still maps them, so no grow may
//      map there;
//   4. once the fence completes (polled at later grows; waited for by
//      empty_cache and teardown) the old addresses are unmapped.  Until
//      then the runs wait in the ledger (ledger_retiring.cpp).
//
// The handle then belongs to its new address: unmap_pages releases it
// there, and the driver frees the memory once no address maps it
// (cuMemRelease may come before the last cuMemUnmap).  Physical memory
// stays what the release would have left; only address space is held
// twice until the fence completes.  Donors are untagged runs (a tagged
// segment's memory stays its tag's: docs/PAUSE.md, Guarantee 1) of any
// stream's reservation, the grow's own included (there a remap also undoes
// fragmentation), and of either pool where the run is a whole number of
// the grow's pages.  Without joins (old drivers, fence_join:false
// backends, a capture in flight) release_before_peak's synchronizing path
// serves instead.
#include <algorithm>
#include <limits>

#include "caching_allocator.h"

namespace cachalloc {

namespace {

std::size_t page_of(const Segment* seg, DevicePtr at) { return (at - seg->base) / seg->page; }

}  // namespace

// Whether every whole run of the free block `b` is a multiple of `page`:
// it can then be mapped whole into a segment of that page size (a large
// pool's 20 MiB runs anywhere; a small pool's only where they happen to be).
bool CachingAllocator::runs_fit(const Block* b, std::size_t page) const {
  const Segment* from = b->segment;
  DevicePtr lo = 0, hi = 0;
  unmappable_runs_of(b, &lo, &hi);
  for (std::size_t i = page_of(from, lo), end = page_of(from, hi); i < end;) {
    const std::size_t n = std::max<std::size_t>(from->run_pages[i], 1);
    if (n * from->page % page != 0) return false;
    i += n;
  }
  return true;
}

// An unmapped block whose pages still retire (a detached range keeps a
// block of its own until then: no grow maps there, nothing merges into it).
bool CachingAllocator::retiring_block(const Block* b) const {
  const Segment* seg = b->segment;
  return !b->is_mapped() && seg->retiring_pages != 0 && seg->retiring[page_of(seg, b->ptr)];
}

// Once its pages are unmapped, the block at `at` merges with the unmapped
// blocks beside it, as unmap_free_block would have done.
void CachingAllocator::merge_retired(Segment* seg, DevicePtr at) {
  Block* b = seg->head;
  while (b != nullptr && b->ptr + b->size <= at) b = b->next;
  if (b == nullptr || b->is_mapped() || retiring_block(b)) return;
  for (Block* n : {b->prev, b->next})
    if (n != nullptr && !n->is_mapped() && !retiring_block(n)) absorb(b, n);
}

// The runs tiling [at, at+bytes) leave `seg` still mapped: their handles go
// to `out`, their pages become retiring (remap_before_new_peak maps them
// elsewhere; retire_remapped unmaps the old addresses).
void CachingAllocator::detach_pages(Segment* seg, DevicePtr at, std::size_t bytes, std::vector<DetachedRun>* out) {
  if (seg->retiring.empty()) seg->retiring.assign(seg->handles.size(), false);
  for (std::size_t i = page_of(seg, at), end = page_of(seg, at + bytes); i < end;) {
    const std::size_t n = std::max<std::size_t>(seg->run_pages[i], 1);
    out->push_back({seg->base + i * seg->page, n * seg->page, seg->handles[i]});
    std::fill_n(seg->handles.begin() + static_cast<std::ptrdiff_t>(i), n, 0);
    std::fill_n(seg->retiring.begin() + static_cast<std::ptrdiff_t>(i), n, true);
    seg->run_pages[i] = 0;
    seg->retiring_pages += n;
    i += n;
  }
}

// release_remap's plan for a grow of `bytes` at the unmapped block `u` of
// `seg` that would pass the mapped high-water mark: the free runs to map
// there, chosen as release_before_new_peak chooses what to unmap (the
// smallest run that covers the excess, else the largest, again), among
// untagged runs of any reservation that are whole pages of seg and fit in
// what the grow maps, never more (a larger run would keep mapped what the
// synchronizing path gives back).  The free block the grow extends
// (u->prev) is no donor: the grow counted it.  True when the plan keeps
// the peak where release_before_peak's synchronizing path would keep it;
// else that path serves the grow.
bool CachingAllocator::plan_remap(const Segment* seg, const Block* u, std::size_t bytes, RemapPlan* plan) const {
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  const std::size_t mark = std::max(mapped_high_water_, reserved);
  if (reserved + bytes <= mark) return false;  // (no new peak: neither path acts)
  const std::size_t excess = reserved + bytes - mark;
  auto runs = unmappable_free_blocks();
  runs.erase(std::remove_if(runs.begin(), runs.end(), [&](const auto& d) { return d.second == u->prev; }), runs.end());
  std::sort(runs.begin(), runs.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  auto donors = runs;
  donors.erase(std::remove_if(donors.begin(), donors.end(),
                              [&](const auto& d) {
                                return d.second->segment->tag != kUntagged || !runs_fit(d.second, seg->page);
                              }),
               donors.end());
  plan->bytes = pick_runs(donors, excess, std::min(bytes, u->size), &plan->donors);
  // (what the synchronizing path would give back towards the excess)
  const std::size_t released = pick_runs(runs, excess, std::numeric_limits<std::size_t>::max(), nullptr);
  return plan->bytes != 0 && std::min(plan->bytes, excess) >= std::min(released, excess);
}

// Picks from `runs` (bytes, block; by bytes ascending) as the release paths
// do, until `excess` is covered or nothing more fits in `limit`; returns
// the bytes picked, and the blocks in `picked` when given.
std::size_t CachingAllocator::pick_runs(std::vector<std::pair<std::size_t, Block*>> runs, std::size_t excess,
                                        std::size_t limit, std::vector<Block*>* picked) {
  std::size_t total = 0;
  while (total < excess) {
    const std::size_t i = pick_free_run(runs, excess - total, limit - total);
    if (i == runs.size()) break;
    total += runs[i].first;
    if (picked != nullptr) picked->push_back(runs[i].second);
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return total;
}

// release_remap's form of release_before_new_peak: carries out `plan` (see
// plan_remap) for the grow at the unmapped block `u` of `seg`, behind one
// joined fence.  Returns the bytes mapped at u's start (whole runs, within
// u, access granted), 0 when none.
std::size_t CachingAllocator::remap_before_new_peak(Segment* seg, Block* u, const RemapPlan& plan) {
  FenceId fence = 0;
  DeviceBackend::FenceCost cost;
  if (backend_->fence_record(&fence, &cost) != kSuccess) return 0;  // (a capture: nothing moves)
  ++stats_.num_fences;
  stats_.num_fence_events += cost.events;
  stats_.num_fence_stream_queries += cost.stream_queries;
  if (backend_->fence_join(fence) != kSuccess) {
    backend_->fence_destroy(fence);
    return 0;
  }
  RetiringRuns retiring{fence, {}};
  const std::size_t moved = remap_donors(seg, u->ptr, plan, &retiring);
  if (retiring.runs.empty()) {
    backend_->fence_destroy(fence);
    return 0;
  }
  ledger_.retire_after(std::move(retiring));
  ++stats_.num_peak_releases;
  if (moved != 0) {
    ++stats_.num_peak_remaps;
    stats_.peak_remap_bytes += static_cast<std::int64_t>(moved);
  }
  return moved;
}

// Moves the plan's donor runs to `at` (see remap_before_new_peak) and
// returns the bytes mapped there; the old addresses go to `retiring`.
std::size_t CachingAllocator::remap_donors(Segment* seg, DevicePtr at, const RemapPlan& plan, RetiringRuns* retiring) {
  std::size_t moved = 0;
  for (Block* donor : plan.donors) {
    Segment* from = donor->segment;
    std::vector<DetachedRun> runs;
    // (a detached block merges with nothing, so the other donors stay whole)
    stats_.peak_release_bytes += static_cast<std::int64_t>(unmap_free_block(donor, false, &runs));
    for (const DetachedRun& r : runs) {
      retiring->runs.emplace_back(from, r);
      if (backend_->vm_map(at + moved, r.bytes, r.handle) != kSuccess) continue;  // (released with the old address)
      const std::size_t first = page_of(seg, at + moved);
      std::fill_n(seg->handles.begin() + static_cast<std::ptrdiff_t>(first), r.bytes / seg->page, r.handle);
      seg->run_pages[first] = static_cast<std::uint32_t>(r.bytes / seg->page);
      retiring->runs.back().second.handle = 0;  // owned at its new address now
      moved += r.bytes;
    }
  }
  if (moved != 0 && grant_access(at, moved) != kSuccess) {
    // (no kernel can have used the new address yet: it is unmapped again)
    unmap_pages(seg, at, moved);
    moved = 0;
  }
  return moved;
}

// Unmaps the old addresses of remapped runs whose fence has completed
// (wait: waits for every fence first), oldest first, as the ledger hands
// them over.  A run whose new mapping failed still holds its handle here,
// released with the old address.
void CachingAllocator::retire_remapped(bool wait) {
  while (RetiringRuns* r = ledger_.retired(wait)) {
    for (auto& [seg, run] : r->runs) {
      // (cuMemUnmap of a whole mapping fails only on a dead context, where
      // release_after_context_death takes over)
      backend_->vm_unmap(run.old_at, run.bytes);
      if (run.handle != 0) backend_->vm_release(run.handle);
      const std::size_t first = page_of(seg, run.old_at);
      std::fill_n(seg->retiring.begin() + static_cast<std::ptrdiff_t>(first), run.bytes / seg->page, false);
      seg->retiring_pages -= run.bytes / seg->page;
    }
    for (auto& [seg, run] : r->runs) merge_retired(seg, run.old_at);
    ledger_.pop_retired();
  }
}

}  // namespace cachalloc
