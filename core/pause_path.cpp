// pause_path.cpp — pausing a tag: its physical pages go back to the device,
// its addresses stay; resuming maps new pages at the same addresses.
//
// Why it is safe by construction: a tag's blocks live in segments of their
// own (block.h), all virtual reservations mapped page by page
// (expandable.cpp), so a pause walks the tag's segments only and can never
// release a page that another tag's block uses (torch_memory_saver #85).
//
// pause(tag):
//   1. synchronize the device, then complete pending events and fences:
//      no kernel may still use the tag's memory, and blocks freed before
//      come back to their pools (the device synchronization is the "wait
//      for the work that may use the tag's memory": documented in PAUSE.md);
//   2. backup (tags that ask for one, pause_backup.cpp): every live block
//      is copied to one pinned host buffer, or through pinned staging
//      buffers to a file;
//   3. every mapped run of the tag is unmapped and released and its pages
//      marked paused (Segment::paused), stopping at the first failure;
//   4. once all are released, the whole pages of free blocks stop being
//      paused and become unmapped address space (as expandable segments
//      unmap cached pages): a resume will not map them.
// resume(tag): pages of blocks freed while paused are forgotten the same
//   way; then new memory is mapped at every paused page, consecutive pages
//   in runs (so that the next pause costs two driver calls a run; all or nothing; out
//   of memory releases the cache and retries once, as a malloc does),
//   and the backup restored (all or nothing: on failure the pages go again
//   and the backup stays for a retry).
//
// While paused: malloc in the tag answers kTagPaused; free works on the
// block records only, touching no page (torch_memory_saver #92); the tag's
// free pages are in no cache trim.  Failures never lose a handle: a handle
// that a failed release left over is kept in orphans_ and released later.
#include <algorithm>
#include <chrono>
#include <tuple>

#include "caching_allocator.h"

namespace cachalloc {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TagState& CachingAllocator::tag_state(TagId tag) { return tags_[tag]; }

void CachingAllocator::set_tag_backup(TagId tag, BackupMode mode) {
  if (tag == kUntagged) return;
  std::lock_guard lock(mutex_);
  tag_state(tag).backup = mode;
}

void CachingAllocator::set_tag_retain_backup(TagId tag, bool retain) {
  if (tag == kUntagged) return;
  std::lock_guard lock(mutex_);
  tag_state(tag).retain = retain;  // read at the next resume (a retained backup stays until then)
}

std::string CachingAllocator::tag_failure(TagId tag) const {
  std::lock_guard lock(mutex_);
  auto it = tags_.find(tag);
  return it == tags_.end() ? std::string() : it->second.failure;
}

bool CachingAllocator::tag_paused(TagId tag) const {
  std::lock_guard lock(mutex_);
  auto it = tags_.find(tag);
  return it != tags_.end() && it->second.paused;
}

Status CachingAllocator::pause(TagId tag, bool* no_op) {
  if (no_op != nullptr) *no_op = false;
  if (tag == kUntagged) return kInvalidValue;
  std::lock_guard lock(mutex_);
  TagState& ts = tag_state(tag);
  bool mapped = false;
  for_tag_segments(tag, [&](Segment* seg) {
    for (MemHandle h : seg->handles) mapped = mapped || h != 0;
  });
  if (ts.paused && !mapped) {
    if (no_op != nullptr) *no_op = true;
    return kSuccess;
  }
  if (!ts.paused && tag_exported(tag)) {
    // An importer of an export keeps the old pages and would never see the
    // resumed ones: refused, loudly, rather than left to diverge silently.
    ts.failure = "a block of the tag was exported (cuMemGetHandleForAddressRange); its importers would keep the "
                 "released pages and never see the resumed ones, so the tag cannot be paused";
    return kInvalidValue;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ts.failure.clear();
  release_orphans();
  settle_held();
  Status st = backend_->synchronize_device();
  if (st != kSuccess) return st;
  ++stats_.num_sync_all_streams;
  ledger_.synchronize();  // pending and deferred frees of the tag come back to its pools
  if (!ts.paused) {
    if (ts.backup != BackupMode::none) {
      st = take_backup(tag, ts);
      if (st != kSuccess) {
        if (!ts.retain) release_host_buffer(ts);
        return st;
      }
    } else {
      drop_backup(ts);  // a backup retained from an earlier pause is stale from here
      release_host_buffer(ts);
    }
    ts.paused = true;  // from here its mallocs are refused
  }
  std::size_t released = 0;
  st = release_tag_pages(tag, &released);
  if (st != kSuccess) {
    bool any_paused = false;
    for_tag_segments(tag, [&](Segment* seg) { any_paused = any_paused || seg->paused_pages != 0; });
    if (!any_paused) {  // nothing released: the tag runs on, as before the call
      ts.paused = false;
      drop_backup(ts);
      if (!ts.retain) release_host_buffer(ts);
    }
    return st;
  }
  forget_free_pages_of(tag);
  ++ts.pauses;
  ts.last_pause_seconds = seconds_since(t0);
  ts.pause_seconds += ts.last_pause_seconds;
  return kSuccess;
}

Status CachingAllocator::resume(TagId tag, bool* no_op) {
  if (no_op != nullptr) *no_op = false;
  if (tag == kUntagged) return kInvalidValue;
  std::lock_guard lock(mutex_);
  auto it = tags_.find(tag);
  if (it == tags_.end() || !it->second.paused) {
    if (no_op != nullptr) *no_op = true;
    return kSuccess;
  }
  TagState& ts = it->second;
  const auto t0 = std::chrono::steady_clock::now();
  ts.failure.clear();
  release_orphans();
  forget_free_pages_of(tag);  // blocks freed while paused
  Status st = map_paused_pages(tag);
  if (st == kOutOfMemory) {
    // As a malloc's out-of-memory path: cached free memory of every other
    // tag and of untagged blocks goes back to the device first, then one retry.
    ledger_.synchronize();
    release_all_cached();
    st = map_paused_pages(tag);
  }
  if (st != kSuccess) return st;
  if (ts.backup_valid) {
    st = restore_backup(ts);
    if (st != kSuccess) {
      // All or nothing: the pages go again, the backup stays for a retry.
      std::size_t released = 0;
      const Status again = release_tag_pages(tag, &released);
      return again != kSuccess ? again : st;
    }
  }
  ts.paused = false;
  settle_backup_after_resume(ts);  // a file goes (its space with it); a host buffer too, unless retained
  ++ts.resumes;
  ts.last_resume_seconds = seconds_since(t0);
  ts.resume_seconds += ts.last_resume_seconds;
  return kSuccess;
}

// The tag's free blocks give up their released pages for good: their whole
// pages become unmapped address space (no driver call: the pause released
// them), so that resume maps pages under live blocks only.  A free block
// with a page still mapped (a pause that failed half-way) is left alone.
void CachingAllocator::forget_free_pages_of(TagId tag) {
  for (BlockPool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> free_blocks;
    for (Block* b : pool->blocks.all()) {
      const Segment* seg = b->segment;
      if (seg->tag != tag || seg->paused_pages == 0) continue;
      const std::size_t first = (b->ptr - seg->base + seg->page - 1) / seg->page;
      const std::size_t end = (b->ptr + b->size - seg->base) / seg->page;
      bool all_paused = first < end;
      for (std::size_t i = first; i < end && all_paused; ++i) all_paused = seg->paused[i];
      if (all_paused) free_blocks.push_back(b);
    }
    for (Block* b : free_blocks) unmap_free_block(b, true);
  }
}

// Releases every mapped run of the tag; stops at the first failure (that
// run stays mapped, with its contents).  *released counts pages released.
Status CachingAllocator::release_tag_pages(TagId tag, std::size_t* released) {
  Status st = kSuccess;
  for_tag_segments(tag, [&](Segment* seg) {
    for (std::size_t i = 0; i < seg->handles.size() && st == kSuccess;) {
      const std::size_t n = std::max<std::size_t>(seg->run_pages[i], 1);
      if (seg->handles[i] != 0) {
        st = release_run(seg, i);
        if (st == kSuccess) *released += n;
      }
      i += n;
    }
  });
  return st;
}

// Unmaps and releases the run starting at page i, marking its pages paused,
// each a run of one without a handle (so that a resume may map them in
// other runs).  On failure the run is left as it was (mapped, same handle,
// same contents) where the driver allows; a handle that can be neither
// released nor mapped again is kept in orphans_ (the pages are then
// paused: their contents are gone).
//
// Why runs: the driver's cost of a pause is per mapping, not per byte
// (H200: unmap + release 2.1-2.8 ms/GiB in 20 MiB handles, 0.5 in 1 GiB
// ones), so the resume maps consecutive paused pages as runs and the next
// pause releases each with two calls.
Status CachingAllocator::release_run(Segment* seg, std::size_t i) {
  const std::size_t n = std::max<std::size_t>(seg->run_pages[i], 1);
  const DevicePtr at = seg->base + i * seg->page;
  const std::size_t bytes = n * seg->page;
  const MemHandle h = seg->handles[i];
  Status st = backend_->vm_unmap(at, bytes);
  if (st != kSuccess) return st;
  st = backend_->vm_release(h);
  if (st != kSuccess) {
    if (backend_->vm_map(at, bytes, h) == kSuccess) {
      if (grant_access(at, bytes) == kSuccess) return st;
      backend_->vm_unmap(at, bytes);
    }
    orphans_.push_back(h);
  }
  for (std::size_t k = i; k < i + n; ++k) {
    seg->handles[k] = 0;
    seg->run_pages[k] = 1;
    seg->paused[k] = true;
  }
  seg->paused_pages += n;
  ++stats_.num_device_free;
  stats_.reserved_bytes.decrease(seg->small, static_cast<std::int64_t>(bytes));
  return st;
}

// Maps new memory at every paused page of the tag, each range of
// consecutive paused pages in runs (map_pages: one physical allocation per
// run of up to max_run_bytes, one access grant per range); on failure
// unmaps what it mapped, leaving the tag as paused as before.
Status CachingAllocator::map_paused_pages(TagId tag) {
  std::vector<std::tuple<Segment*, std::size_t, std::size_t>> mapped;  // (segment, first page, pages)
  Status st = kSuccess;
  for_tag_segments(tag, [&](Segment* seg) {
    for (std::size_t i = 0; i < seg->paused.size() && st == kSuccess;) {
      if (!seg->paused[i]) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < seg->paused.size() && seg->paused[j]) ++j;
      st = map_paused_range(seg, i, j - i);
      if (st == kSuccess) mapped.emplace_back(seg, i, j - i);
      i = j;
    }
  });
  if (st != kSuccess) {
    for (auto [seg, first, n] : mapped) drop_paused_range(seg, first, n);
    return st;
  }
  for (auto [seg, first, n] : mapped) {
    for (std::size_t k = first; k < first + n; ++k) seg->paused[k] = false;
    seg->paused_pages -= n;
    stats_.reserved_bytes.increase(seg->small, static_cast<std::int64_t>(n * seg->page));
  }
  return kSuccess;
}

// Maps the n paused pages from `first` (still marked paused) in runs.
Status CachingAllocator::map_paused_range(Segment* seg, std::size_t first, std::size_t n) {
  auto pages = seg->run_pages.begin() + static_cast<std::ptrdiff_t>(first);
  std::fill_n(pages, n, 0);  // (map_run marks the runs it makes)
  const Status st = map_pages(seg, seg->base + first * seg->page, n * seg->page);
  if (st != kSuccess) std::fill_n(pages, n, 1);  // paused pages again, runs of one
  return st;
}

// Undoes a resume's mapping of the n pages from `first` (still marked paused).
void CachingAllocator::drop_paused_range(Segment* seg, std::size_t first, std::size_t n) {
  unmap_pages(seg, seg->base + first * seg->page, n * seg->page);
  std::fill_n(seg->run_pages.begin() + static_cast<std::ptrdiff_t>(first), n, 1);
}

// Whether a live block of the tag's segments was exported.  A freed one is
// retained (Block::retained), never handed out again: no one in the program
// can see its pages change, so it does not stop a pause.
bool CachingAllocator::tag_exported(TagId tag) {
  bool exported = false;
  for_tag_segments(tag, [&](Segment* seg) {
    for (const Block* b = seg->head; b != nullptr && !exported; b = b->next) exported = b->exported;
  });
  return exported;
}

void CachingAllocator::release_orphans() {
  std::erase_if(orphans_, [&](MemHandle h) { return backend_->vm_release(h) == kSuccess; });
}

std::vector<TagStats> CachingAllocator::tag_stats() const {
  std::lock_guard lock(mutex_);
  std::vector<TagStats> out;
  for (const auto& [tag, ts] : tags_) {
    TagStats s;
    s.tag = tag;
    s.paused = ts.paused;
    s.backup = ts.backup != BackupMode::none;
    s.backup_mode = ts.backup;
    s.backup_location = ts.backup_valid ? ts.location : BackupMode::none;
    s.backup_bytes = ts.backup_valid ? ts.backup_bytes : 0;
    s.backup_capacity = ts.host_capacity;
    s.retain = ts.retain;
    if (ts.retained && !ts.entries.empty()) s.retained_bytes = ts.entries.back().offset + ts.entries.back().size;
    s.disk_bytes = s.backup_location == BackupMode::disk ? s.backup_bytes : 0;
    s.disk_files = ts.files.size();
    if (ts.backup == BackupMode::disk || s.backup_location == BackupMode::disk) s.staging_bytes = 2 * staging_half_;
    s.pauses = ts.pauses;
    s.resumes = ts.resumes;
    s.pause_seconds = ts.pause_seconds;
    s.resume_seconds = ts.resume_seconds;
    s.last_pause_seconds = ts.last_pause_seconds;
    s.last_resume_seconds = ts.last_resume_seconds;
    for (const Segment* seg : expandable_) {
      if (seg->tag != tag) continue;
      ++s.segments;
      s.paused_bytes += seg->paused_pages * seg->page;
      s.reserved_bytes += mapped_bytes(seg) + seg->paused_pages * seg->page;
      for (const Block* b = seg->head; b != nullptr; b = b->next)
        if (b->is_allocated()) s.allocated_bytes += b->size;
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace cachalloc
