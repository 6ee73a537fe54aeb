// expandable.cpp — expandable segments (expandable_segments:true).
//
// Instead of one device allocation per segment, each (pool, stream) gets one
// virtual address reservation, and physical pages are mapped at its unmapped
// ranges when more memory is needed and unmapped from free blocks when memory
// is released.  A free block can then grow into the address space after it,
// so a program whose sizes change over time does not strand reserved memory
// in blocks too small for its next requests (PyTorch's motivation).
//
// Pages are 2 MiB in the small pool and 20 MiB in the large pool.  Reserved
// bytes count mapped pages; the segment statistic counts reservations.
//
// Runs: a growth of several pages maps them as runs of up to kMaxRunBytes,
// one physical allocation each, and grants access to the whole growth at
// once: 2 driver calls per run and 1 per growth, where a handle per page
// took 3 per page (a 256 MiB logits tensor, 13 pages: 11 calls instead of
// 39).  Those calls were most of what the DDP program made under
// expandable segments (docs/BENCHMARKS.md section 5).  The price: a run is
// unmapped whole, so a run with a live block in it keeps its free pages
// mapped when memory is released — at most kMaxRunBytes less a page per
// such run.  Tagged segments take runs of up to kMaxTaggedRunBytes: the
// driver's cost of a pause and a resume is per mapping, not per byte
// (H200, 8 GiB: unmap + release 2.1-2.8 ms/GiB in 20 MiB handles, 0.5-0.6
// in 400 MiB ones; create + map + access 2.1 and 0.16 ms/GiB), and a
// tag's memory is mostly released whole, by a pause, which splits its runs
// into paused pages; the resume maps each range of them as runs again
// (pause_path.cpp).
#include <algorithm>
#include <limits>
#include <tuple>

#include "caching_allocator.h"
#include "size_policy.h"

namespace cachalloc {

namespace {

constexpr std::size_t kMaxRunBytes = 64ull << 20;
constexpr std::size_t kMaxTaggedRunBytes = 512ull << 20;

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }
std::size_t round_down(std::size_t n, std::size_t unit) { return n / unit * unit; }

std::size_t max_run_bytes(const Segment* seg) {
  const std::size_t most = seg->tag != kUntagged ? kMaxTaggedRunBytes : kMaxRunBytes;
  return std::max(seg->page, round_down(most, seg->page));
}

std::size_t page_index(const Segment* seg, DevicePtr at) { return (at - seg->base) / seg->page; }

}  // namespace

Segment* CachingAllocator::expandable_for(BlockPool& pool, StreamId stream, Status* err) {
  for (Segment* seg : expandable_)
    if (seg->small == pool.small && seg->stream == stream && seg->tag == serving_tag_) return seg;
  const std::size_t page = pool.small ? kSmallBuffer : kLargeBuffer;
  // Room for the whole device and then some, as PyTorch reserves: address
  // space is cheap, and one stream may end up holding most of the memory.
  const std::size_t size = round_up(device_total_ + device_total_ / 8 + page, page);
  DevicePtr base = 0;
  *err = backend_->vm_reserve(size, &base);
  if (*err != kSuccess) return nullptr;
  auto* seg = new Segment{base, size, stream, pool.small, nullptr, true, page, {}};
  seg->handles.assign(size / page, 0);
  seg->run_pages.assign(size / page, 0);
  seg->tag = serving_tag_;
  if (seg->tag != kUntagged) seg->paused.assign(size / page, false);
  set_phase(*add_segment(seg), BlockPhase::unmapped);  // address space only, until pages are mapped
  expandable_.push_back(seg);
  return seg;
}

// Maps `bytes` (whole pages) at `at`, in runs, and grants access to all of
// it with one call per device; on failure unmaps what it mapped.
Status CachingAllocator::map_pages(Segment* seg, DevicePtr at, std::size_t bytes) {
  const std::size_t run_max = max_run_bytes(seg);
  std::size_t mapped = 0;
  Status st = kSuccess;
  while (mapped < bytes && st == kSuccess) {
    const std::size_t run = std::min(run_max, bytes - mapped);
    st = map_run(seg, at + mapped, run);
    if (st == kSuccess) mapped += run;
  }
  if (st == kSuccess) st = grant_access(at, bytes);
  if (st != kSuccess) unmap_pages(seg, at, mapped);
  return st;
}

// One physical allocation of `bytes`, mapped at `at` as one run (no access
// yet: grant_access follows).
Status CachingAllocator::map_run(Segment* seg, DevicePtr at, std::size_t bytes) {
  MemHandle h = 0;
  Status st = backend_->vm_create(bytes, &h);
  if (st != kSuccess) return st;
  st = backend_->vm_map(at, bytes, h);
  if (st != kSuccess) {
    backend_->vm_release(h);
    return st;
  }
  const std::size_t first = page_index(seg, at);
  std::fill_n(seg->handles.begin() + static_cast<std::ptrdiff_t>(first), bytes / seg->page, h);
  seg->run_pages[first] = static_cast<std::uint32_t>(bytes / seg->page);
  ++stats_.num_device_alloc;
  return kSuccess;
}

// This device, then every device with peer access, may use [at, at+bytes).
Status CachingAllocator::grant_access(DevicePtr at, std::size_t bytes) {
  const Status st = backend_->vm_set_own_access(at, bytes);
  return st != kSuccess ? st : grant_peers(at, bytes);
}

// Devices with peer access to this context get access to new pages too.
Status CachingAllocator::grant_peers(DevicePtr at, std::size_t bytes) {
  for (int peer : peers_) {
    const Status st = backend_->vm_set_access(at, bytes, peer, true);
    if (st != kSuccess) return st;
  }
  return kSuccess;
}

Status CachingAllocator::set_peer_access(int peer, bool enable) {
  std::lock_guard lock(mutex_);
  const bool listed = std::find(peers_.begin(), peers_.end(), peer) != peers_.end();
  if (enable && !listed) peers_.push_back(peer);
  if (!enable) std::erase(peers_, peer);
  return set_access_of_mapped(peer, enable);
}

// Applies `peer`'s access to every run of mapped pages.
Status CachingAllocator::set_access_of_mapped(int peer, bool enable) {
  Status first_error = kSuccess;
  for (const Segment* seg : expandable_) {
    std::size_t i = 0;
    const std::size_t n = seg->handles.size();
    while (i < n) {
      if (seg->handles[i] == 0) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < n && seg->handles[j] != 0) ++j;
      const Status st = backend_->vm_set_access(seg->base + i * seg->page, (j - i) * seg->page, peer, enable);
      if (st != kSuccess && first_error == kSuccess) first_error = st;
      i = j;
    }
  }
  return first_error;
}

// Unmaps and releases the runs that tile [at, at+bytes).
void CachingAllocator::unmap_pages(Segment* seg, DevicePtr at, std::size_t bytes) {
  for (std::size_t i = page_index(seg, at), end = page_index(seg, at + bytes); i < end;) {
    const std::size_t n = std::max<std::size_t>(seg->run_pages[i], 1);  // (0: not a run's start — a bug)
    backend_->vm_unmap(seg->base + i * seg->page, n * seg->page);
    backend_->vm_release(seg->handles[i]);
    std::fill_n(seg->handles.begin() + static_cast<std::ptrdiff_t>(i), n, 0);
    seg->run_pages[i] = 0;
    ++stats_.num_device_free;
    i += n;
  }
}

// Narrows the page-aligned [*lo, *hi) to the whole runs inside it: a run
// reaching past either end stays mapped.
void CachingAllocator::whole_runs_within(const Segment* seg, DevicePtr* lo, DevicePtr* hi) const {
  std::size_t i = page_index(seg, *lo);
  std::size_t end = page_index(seg, *hi);
  while (i < end && seg->run_pages[i] == 0) ++i;  // inside a run that began before *lo
  if (i < end) {
    std::size_t k = end - 1;
    while (seg->run_pages[k] == 0) --k;  // the start of the run holding the last page (i at the latest)
    if (k + seg->run_pages[k] > end) end = k;
  }
  *lo = seg->base + i * seg->page;
  *hi = seg->base + std::max(i, end) * seg->page;
}

// Maps pages at the first unmapped range that, together with a free block
// just before it, holds `size`; returns that block, out of its pool.
Block* CachingAllocator::grow_expandable(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry,
                                         Status* err) {
  if (is_retry) ++stats_.num_alloc_retries;
  Segment* seg = expandable_for(pool, stream, err);
  if (seg == nullptr) return nullptr;
  if (ledger_.retiring()) [[unlikely]] retire_remapped(false);
  // (named variables, not a structured binding: the lambda below captures
  // them, which C++20 compilers before clang 16 refuse for bindings)
  Block* u = nullptr;
  std::size_t bytes = 0;
  std::tie(u, bytes) = grow_site(seg, size);
  RemapPlan plan;
  const bool remap = u != nullptr && config_.release_before_peak && config_.release_remap &&
                     seg->tag == kUntagged && backend_->fence_join_supported() && plan_remap(seg, u, bytes, &plan);
  if (config_.release_before_peak && !remap) [[unlikely]] {
    release_before_new_peak(round_up(size, seg->page));
    std::tie(u, bytes) = grow_site(seg, size);  // (what was unmapped may have merged into the range)
  }
  // (the fraction counts the planned runs out of reserved memory: they move)
  auto over_fraction = [&](std::size_t leaving) {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
    return config_.per_process_memory_fraction < 1.0 && reserved - leaving + bytes > allowed_bytes_;
  };
  if (u == nullptr || over_fraction(remap ? plan.bytes : 0) ||
      (seg->tag != kUntagged && tag_memory_margin_ != 0 && !within_tag_margin(bytes))) {
    *err = kOutOfMemory;
    return nullptr;
  }
  // Runs taken from free blocks first (release_remap), fresh pages for the rest.
  const std::size_t moved = remap ? remap_before_new_peak(seg, u, plan) : 0;
  if (remap && moved == 0 && over_fraction(0)) {  // (nothing moved after all: a capture)
    *err = kOutOfMemory;
    return nullptr;
  }
  *err = moved < bytes ? map_pages(seg, u->ptr + moved, bytes - moved) : kSuccess;
  if (*err != kSuccess && moved == 0) return nullptr;
  const std::size_t total = *err == kSuccess ? std::max(bytes, moved) : moved;
  Block* mapped = split_off_front(u, total);
  set_phase(*mapped, BlockPhase::detached);
  const auto now = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  stats_.reserved_bytes.increase(pool.small, static_cast<std::int64_t>(total));
  mapped_high_water_ = std::max(mapped_high_water_, now + total);
  notify(TraceKind::segment_map, mapped->ptr, total, stream);
  return_to_pool(mapped);  // merges with the free block before it
  if (*err != kSuccess) return nullptr;  // (what was remapped stays, free; the caller retries)
  pool.blocks.erase(mapped);
  return mapped;
}

// The first unmapped range of `seg` that, together with a free block just
// before it, holds `size`, and the bytes to map there: {nullptr, 0} when
// none does.  (A retiring range is mapped still: no grow there.)
std::pair<Block*, std::size_t> CachingAllocator::grow_site(Segment* seg, std::size_t size) const {
  for (Block* u = seg->head; u != nullptr; u = u->next) {
    if (u->is_mapped() || retiring_block(u)) continue;
    const std::size_t before = (u->prev != nullptr && u->prev->is_free()) ? u->prev->size : 0;
    if (size <= before || before + u->size < size) continue;
    const std::size_t bytes = round_up(size - before, seg->page);
    if (bytes <= u->size) return {u, bytes};
  }
  return {nullptr, 0};
}

// Splits `b` (unmapped, or detached from its bin) so that it keeps its
// first `bytes`; the rest becomes a new block after it in the same phase.
// Returns `b`.
Block* CachingAllocator::split_off_front(Block* b, std::size_t bytes) {
  CACHALLOC_ASSERT(b->phase() == BlockPhase::unmapped || b->phase() == BlockPhase::detached,
                   "split_off_front splits an unmapped or detached block");
  CACHALLOC_ASSERT(bytes > 0 && bytes <= b->size && bytes % kMinBlockSize == 0,
                   "split_off_front keeps a positive multiple of 512 bytes, within the block");
  if (bytes == b->size) return b;
  Block* rest = make_block();
  rest->ptr = b->ptr + bytes;
  rest->size = b->size - bytes;
  rest->stream = b->stream;
  rest->segment = b->segment;
  if (b->phase() == BlockPhase::unmapped) set_phase(*rest, BlockPhase::unmapped);
  rest->prev = b;
  rest->next = b->next;
  if (rest->next != nullptr) rest->next->prev = rest;
  b->next = rest;
  b->size = bytes;
  return b;
}

// The whole pages inside free block `b`.
void CachingAllocator::pages_within(const Block* b, DevicePtr* lo, DevicePtr* hi) const {
  const Segment* seg = b->segment;
  *lo = seg->base + round_up(b->ptr - seg->base, seg->page);
  *hi = seg->base + round_down(b->ptr + b->size - seg->base, seg->page);
}

// The whole runs inside free block `b`: what unmapping it gives back
// (empty when lo >= hi).
void CachingAllocator::unmappable_runs_of(const Block* b, DevicePtr* lo, DevicePtr* hi) const {
  pages_within(b, lo, hi);
  if (*lo < *hi) whole_runs_within(b->segment, lo, hi);
}

// Unmaps every whole page inside the free block `b`; what is left of `b`
// on either side stays a free mapped block.  Returns the bytes unmapped.
// `released`: a pause released those pages already (pause_path.cpp); they
// only stop being paused, with no driver call.  `detach`: the runs are not
// unmapped but handed over, still mapped, for release_remap
// (remap_release.cpp, detach_pages).
std::size_t CachingAllocator::unmap_free_block(Block* b, bool released, std::vector<DetachedRun>* detach) {
  Segment* seg = b->segment;
  DevicePtr lo = 0, hi = 0;
  if (released) pages_within(b, &lo, &hi);
  else unmappable_runs_of(b, &lo, &hi);
  if (lo >= hi) return 0;
  BlockPool& pool = pool_for(seg->small);
  const bool small = seg->small;
  pool.blocks.erase(b);
  if (b->is_split()) {
    stats_.inactive_split.decrease(small, 1);
    stats_.inactive_split_bytes.decrease(small, static_cast<std::int64_t>(b->size));
  }
  Block* middle = b;
  if (lo > b->ptr) {  // keep the head mapped
    middle = split_off_front(b, lo - b->ptr)->next;
    add_free_remnant(b);
  }
  if (hi < middle->ptr + middle->size) add_free_remnant(split_off_front(middle, hi - middle->ptr)->next);
  if (released) {
    for (std::size_t i = page_index(seg, lo); i < page_index(seg, hi); ++i) {
      seg->paused[i] = false;
      seg->run_pages[i] = 0;  // (a paused page is a run of one)
    }
    seg->paused_pages -= (hi - lo) / seg->page;
  } else {
    if (detach != nullptr) detach_pages(seg, lo, hi - lo, detach);
    else unmap_pages(seg, lo, hi - lo);
    stats_.reserved_bytes.decrease(small, static_cast<std::int64_t>(hi - lo));
  }
  set_phase(*middle, BlockPhase::unmapped);
  notify(TraceKind::segment_unmap, lo, hi - lo, seg->stream);
  // (a detached range stays a block of its own while it retires)
  for (Block* n : {middle->prev, middle->next})
    if (n != nullptr && !n->is_mapped() && detach == nullptr && !retiring_block(n)) absorb(middle, n);
  return hi - lo;
}

// A free mapped piece left beside an unmapped range: back to the pool.
void CachingAllocator::add_free_remnant(Block* b) {
  const bool small = b->segment->small;
  stats_.inactive_split.increase(small, 1);
  stats_.inactive_split_bytes.increase(small, static_cast<std::int64_t>(b->size));
  b->gc_stamp = pool_for(small).lookups;
  pool_for(small).blocks.insert(b);
}

// Free blocks of expandable segments holding whole runs, with the bytes
// unmapping each would give back.
std::vector<std::pair<std::size_t, Block*>> CachingAllocator::unmappable_free_blocks() const {
  std::vector<std::pair<std::size_t, Block*>> out;
  for (const BlockPool* pool : {&small_pool_, &large_pool_})
    for (Block* b : pool->blocks.all()) {
      if (!b->segment->expandable || b->segment->paused_pages != 0) continue;  // (paused: nothing mapped to give)
      DevicePtr lo = 0, hi = 0;
      unmappable_runs_of(b, &lo, &hi);
      if (lo < hi) out.emplace_back(hi - lo, b);
    }
  return out;
}

// `only`: the free pages and empty reservations of that tag alone.
void CachingAllocator::unmap_all_free_pages(const TagId* only) {
  if (ledger_.retiring()) retire_remapped(true);  // (release_remap's old addresses)
  auto free_blocks = unmappable_free_blocks();
  if (only != nullptr) std::erase_if(free_blocks, [&](const auto& f) { return f.second->segment->tag != *only; });
  // A free block's pages may still be used by work its stream enqueued
  // before the free (cuMemFreeAsync, or a plain free served without the
  // driver's synchronization), and cuMemUnmap does not wait for that work
  // as cuMemFree does (PyTorch found the same and synchronizes first).
  // Unmapping under a running kernel is an illegal-address fault in the
  // program, so the device is synchronized first; when it cannot be, the
  // pages stay mapped.
  if (!free_blocks.empty() && device_idle_for_unmap())
    for (const auto& [bytes, b] : free_blocks) unmap_free_block(b);
  // A reservation with nothing mapped goes back too.
  for (auto it = expandable_.begin(); it != expandable_.end();) {
    Segment* seg = *it;
    if (seg->head->next != nullptr || seg->head->is_mapped() || seg->retiring_pages != 0 ||
        (only != nullptr && seg->tag != *only)) {
      ++it;
      continue;
    }
    backend_->vm_release_range(seg->base, seg->size);
    stats_.segment.decrease(seg->small, 1);
    segments_.erase(seg->base);
    drop_block(seg->head);
    delete seg;
    it = expandable_.erase(it);
  }
}

// release_before_peak: before a grow of up to `bytes` would map more than
// the process ever had mapped, whole free runs of any pool and stream go
// back until it would not (the smallest run that covers the excess, else
// the largest, again), after one device synchronization (see
// unmap_all_free_pages).  The high-water mark then stays at what the
// program needed at once, plus what free blocks shorter than a run hold:
// cross-stream slack, which CUDA's pool does not keep, cannot pile up.  It
// costs a synchronization and re-mapping only when the mark would rise
// (on hf_gpt2's cudaMallocAsync trace: 10 times, 96 runs mapped for 65).
void CachingAllocator::release_before_new_peak(std::size_t bytes) {
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  mapped_high_water_ = std::max(mapped_high_water_, reserved);  // (a resume maps pages too)
  if (reserved + bytes <= mapped_high_water_) return;
  auto free_runs = unmappable_free_blocks();
  if (free_runs.empty() || !device_idle_for_unmap()) return;
  // (the device is idle: old addresses of remapped runs go now, so that a
  // run unmapped below frees its memory before the grow maps fresh pages)
  if (ledger_.retiring()) [[unlikely]] retire_remapped(false);
  std::sort(free_runs.begin(), free_runs.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  ++stats_.num_peak_releases;
  // (unmapping one block leaves the whole runs of the others as they were)
  std::vector<Block*> picked;
  pick_runs(std::move(free_runs), reserved + bytes - mapped_high_water_, std::numeric_limits<std::size_t>::max(),
            &picked);
  for (Block* b : picked) stats_.peak_release_bytes += static_cast<std::int64_t>(unmap_free_block(b));
}

// Of `runs` (bytes, block; by bytes ascending, none empty), the smallest of
// at most `limit` bytes that covers `excess`, else the largest of at most
// `limit`: the index, or runs.size() when none is that small.  Both
// release_before_new_peak and release_remap choose with it.
std::size_t CachingAllocator::pick_free_run(const std::vector<std::pair<std::size_t, Block*>>& runs,
                                            std::size_t excess, std::size_t limit) {
  std::size_t largest = runs.size();
  for (std::size_t i = 0; i < runs.size() && runs[i].first <= limit; ++i) {
    if (runs[i].first >= excess) return i;
    largest = i;
  }
  return largest;
}

// Whether mapping `bytes` more leaves the device tag_memory_margin_ free
// (an unanswered question lets it through: the driver still refuses what
// does not fit).
bool CachingAllocator::within_tag_margin(std::size_t bytes) {
  std::size_t free_bytes = 0, total_bytes = 0;
  if (backend_->mem_info(&free_bytes, &total_bytes) != kSuccess) return true;
  return free_bytes >= bytes && free_bytes - bytes >= tag_memory_margin_;
}

// Synchronizes the device before pages are unmapped (unmap_all_free_pages).
bool CachingAllocator::device_idle_for_unmap() {
  if (backend_->synchronize_device() != kSuccess) return false;
  ++stats_.num_sync_all_streams;
  return true;
}

std::size_t CachingAllocator::mapped_bytes(const Segment* seg) const {
  if (!seg->expandable) return seg->size;
  std::size_t n = 0;
  for (const Block* b = seg->head; b != nullptr; b = b->next)
    if (b->is_mapped()) n += b->size;
  return n - seg->paused_pages * seg->page;  // released by a pause: held by nobody
}

std::size_t CachingAllocator::unmappable_bytes(const Segment* seg) const {
  std::size_t n = 0;
  if (seg->paused_pages != 0) return 0;  // paused: its free pages went at the pause
  for (const Block* b = seg->head; b != nullptr; b = b->next) {
    if (b->is_allocated() || b->phase() == BlockPhase::retained || !b->is_mapped()) continue;
    DevicePtr lo = 0, hi = 0;
    unmappable_runs_of(b, &lo, &hi);
    if (lo < hi) n += hi - lo;
  }
  return n;
}

}  // namespace cachalloc
