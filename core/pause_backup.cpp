// pause_backup.cpp — a paused tag's backup: its live blocks copied out at
// the pause and back at the resume (pause_path.cpp, docs/PAUSE.md).
//
// The backup lies end to end, block after block (TagState::entries, in
// offset order), in one of two places:
//   host  one buffer per tag, pinned (host) or pageable (an anonymous
//         mapping: no pinning cost, reclaimable, copies staged by the
//         driver), filled by copies on the backend's copy stream in 64 MiB
//         pieces and waited for once.  The resume gives it back, so that
//         the process's host memory drops (as torch_memory_saver's does),
//         unless the tag retains it (TagState::retain): then it stays,
//         answers backup_pointer() with the contents of the pause, and the
//         next pause refills it in place (no new pinned allocation, ~0.8 ms
//         per MiB on an H100);
//   disk  files in pause_backup_dir (pause_disk.cpp), for tags larger than
//         the host memory to spare.
// Failures leave no partial backup: pause fails with nothing changed (the
// files, if made, are closed and gone); resume fails with the backup intact
// for a retry.  A file's failure says why in TagState::failure.
#include <algorithm>

#include "caching_allocator.h"

namespace cachalloc {

namespace {

// Host backup copies are issued in pieces, so that a copy engine
// interleaves them with other traffic and no single call is huge.
constexpr std::size_t kHostCopyPiece = 64 * MiB;

}  // namespace

// Copies every live block of the tag to where the tag asks.
Status CachingAllocator::take_backup(TagId tag, TagState& ts) {
  drop_backup(ts);
  ts.entries.clear();
  std::size_t total = 0;
  for_tag_segments(tag, [&](Segment* seg) {
    for (const Block* b = seg->head; b != nullptr; b = b->next)
      if (b->is_allocated()) {
        ts.entries.push_back({b->ptr, b->size, total, b->id});
        total += b->size;
      }
  });
  const BackupMode where = ts.backup;
  const Status st = where == BackupMode::disk ? write_disk_backup(ts, total) : write_host_backup(ts, total, where);
  if (st != kSuccess) return st;
  ts.backup_valid = true;
  ts.location = where;
  ts.backup_bytes = total;
  for (const BackupEntry& e : ts.entries) ts.backup_blocks.emplace(e.ptr, e.id);
  return kSuccess;
}

Status CachingAllocator::backup_pointer(DevicePtr ptr, std::size_t size, void** host) const {
  std::lock_guard lock(mutex_);
  *host = nullptr;
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return kNotOwned;
  const Segment* seg = (--it)->second;
  if (ptr >= seg->base + seg->size) return kNotOwned;
  const Block* b = seg->head;
  while (b != nullptr && ptr >= b->ptr + b->size) b = b->next;
  if (b == nullptr || !b->is_allocated() || ptr + size > b->ptr + b->size) return kInvalidValue;
  auto ts = tags_.find(seg->tag);
  if (ts == tags_.end()) return kSuccess;  // (untagged too: never in tags_)
  const TagState& t = ts->second;
  if (!t.retained && !(t.backup_valid && in_host_memory(t.location))) return kSuccess;
  for (const BackupEntry& e : t.entries)
    if (e.ptr == b->ptr && e.id == b->id) {
      *host = static_cast<unsigned char*>(t.host) + e.offset + (ptr - e.ptr);
      break;
    }
  return kSuccess;
}

Status CachingAllocator::restore_backup(TagState& ts) {
  return ts.location == BackupMode::disk ? read_disk_backup(ts) : read_host_backup(ts);
}

// The backup is no longer needed (restored, or its pause undone): a file
// goes at once, with its disk space; the host buffer is the caller's
// (release_host_buffer, settle_backup_after_resume).
void CachingAllocator::drop_backup(TagState& ts) {
  close_backup_files(ts);
  ts.backup_valid = false;
  ts.location = BackupMode::none;
  ts.backup_bytes = 0;
  ts.retained = false;
  ts.backup_blocks.clear();
}

// The tag's host buffer goes back (munmap'ed or unpinned and freed).
void CachingAllocator::release_host_buffer(TagState& ts) {
  if (ts.host != nullptr) {
    if (ts.host_kind == BackupMode::pageable) backend_->pageable_free(ts.host, ts.host_capacity);
    else backend_->host_free(ts.host);
  }
  ts.host = nullptr;
  ts.host_capacity = 0;
  if (ts.retained) ts.backup_blocks.clear();
  ts.retained = false;
}

// After a successful restore: a host backup the tag retains stays, with its
// entries, as the contents of the pause; any other goes.
void CachingAllocator::settle_backup_after_resume(TagState& ts) {
  const bool keep = ts.retain && in_host_memory(ts.location) && ts.host != nullptr;
  auto blocks = std::move(ts.backup_blocks);
  drop_backup(ts);
  if (!keep) {
    release_host_buffer(ts);
    return;
  }
  ts.retained = true;
  ts.backup_blocks = std::move(blocks);
}

// A block of tagged segment was freed: if it was the last live block a held
// backup copied, the backup goes, with its memory (host buffer, files).
void CachingAllocator::note_tagged_free(const Block* b) {
  auto it = tags_.find(b->segment->tag);
  if (it == tags_.end() || it->second.backup_blocks.empty()) return;
  TagState& ts = it->second;
  auto e = ts.backup_blocks.find(b->ptr);
  if (e == ts.backup_blocks.end() || e->second != b->id) return;
  ts.backup_blocks.erase(e);
  if (!ts.backup_blocks.empty()) return;
  drop_backup(ts);
  release_host_buffer(ts);
}

// Everything a tag's backups hold (at destruction).
void CachingAllocator::free_backup_storage(TagState& ts) {
  drop_backup(ts);
  release_host_buffer(ts);
}

Status CachingAllocator::write_host_backup(TagState& ts, std::size_t total, BackupMode kind) {
  if (total > ts.host_capacity || (ts.host != nullptr && ts.host_kind != kind)) {
    release_host_buffer(ts);
    void* host = nullptr;
    const Status st = kind == BackupMode::pageable ? backend_->pageable_alloc(total, &host)
                                                   : backend_->host_alloc(total, &host);
    if (st != kSuccess) return st;
    ts.host = host;
    ts.host_capacity = total;
    ts.host_kind = kind;
  }
  auto* base = static_cast<unsigned char*>(ts.host);
  for (const BackupEntry& e : ts.entries)
    for (std::size_t off = 0; off < e.size; off += kHostCopyPiece) {
      const std::size_t n = std::min(kHostCopyPiece, e.size - off);
      const Status st = backend_->copy_to_host_async(base + e.offset + off, e.ptr + off, n);
      if (st != kSuccess) {
        backend_->copy_synchronize();  // nothing may still write the buffer
        return st;
      }
    }
  return backend_->copy_synchronize();
}

Status CachingAllocator::read_host_backup(TagState& ts) {
  const auto* base = static_cast<const unsigned char*>(ts.host);
  for (const BackupEntry& e : ts.entries) {
    // A block freed while paused has no pages any more (its whole pages were
    // forgotten): nothing to restore.  No block of the tag can have been
    // allocated since (its mallocs were refused).
    const Block* b = find_live(e.ptr);
    if (b == nullptr || b->size != e.size) continue;
    for (std::size_t off = 0; off < e.size; off += kHostCopyPiece) {
      const std::size_t n = std::min(kHostCopyPiece, e.size - off);
      const Status st = backend_->copy_to_device_async(e.ptr + off, base + e.offset + off, n);
      if (st != kSuccess) {
        backend_->copy_synchronize();
        return st;
      }
    }
  }
  return backend_->copy_synchronize();
}

}  // namespace cachalloc
