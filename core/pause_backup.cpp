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
//   disk  a file without a name (backup_file.cpp) in pause_backup_dir, for
//         tags larger than the host memory to spare.  The bytes go through
//         two pinned staging halves of at most pause_backup_chunk bytes
//         each (the device's) whatever the tag's size: while the device
//         copies chunk k into one half, chunk k-1 goes from the other half
//         to the file (one copy in flight at a time, so copy_synchronize
//         waits for exactly that one); a resume reads chunk k into one half
//         while chunk k-1 is copied to the device from the other.  The file
//         lives from the pause to the resume that restored it.
// Failures leave no partial backup: pause fails with nothing changed (the
// file, if made, is closed and gone); resume fails with the backup intact
// for a retry.  A file's failure says why in TagState::failure.
#include <algorithm>
#include <cstdlib>

#include "caching_allocator.h"

namespace cachalloc {

namespace {

// Host backup copies are issued in pieces, so that a copy engine
// interleaves them with other traffic and no single call is huge.
constexpr std::size_t kHostCopyPiece = 64 * MiB;

// The directory of backup files: pause_backup_dir, else $TMPDIR, else /tmp.
std::string backup_dir(const Config& c) {
  if (!c.pause_backup_dir.empty()) return c.pause_backup_dir;
  const char* t = std::getenv("TMPDIR");
  return t != nullptr && *t != '\0' ? std::string(t) : std::string("/tmp");
}

// Calls fn(entry, offset into the entry, bytes, offset from lo) for each
// piece of the backup's bytes [lo, hi); stops at the first failure.
template <typename Fn>
Status for_pieces(const std::vector<BackupEntry>& entries, std::size_t lo, std::size_t hi, Fn&& fn) {
  auto it = std::upper_bound(entries.begin(), entries.end(), lo,
                             [](std::size_t at, const BackupEntry& e) { return at < e.offset + e.size; });
  for (; it != entries.end() && it->offset < hi; ++it) {
    const std::size_t from = std::max(lo, it->offset);
    const std::size_t to = std::min(hi, it->offset + it->size);
    const Status st = fn(*it, from - it->offset, to - from, from - lo);
    if (st != kSuccess) return st;
  }
  return kSuccess;
}

}  // namespace

// Copies every live block of the tag to where the tag asks.
Status CachingAllocator::take_backup(TagId tag, TagState& ts) {
  drop_backup(ts);
  ts.entries.clear();
  std::size_t total = 0;
  for_tag_segments(tag, [&](Segment* seg) {
    for (const Block* b = seg->head; b != nullptr; b = b->next)
      if (b->allocated) {
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
  if (b == nullptr || !b->allocated || ptr + size > b->ptr + b->size) return kInvalidValue;
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
  if (ts.file >= 0) backend_->file_close(ts.file);
  ts.file = -1;
  ts.backup_valid = false;
  ts.location = BackupMode::none;
  ts.backup_bytes = 0;
  ts.retained = false;
}

// The tag's host buffer goes back (munmap'ed or unpinned and freed).
void CachingAllocator::release_host_buffer(TagState& ts) {
  if (ts.host != nullptr) {
    if (ts.host_kind == BackupMode::pageable) backend_->pageable_free(ts.host, ts.host_capacity);
    else backend_->host_free(ts.host);
  }
  ts.host = nullptr;
  ts.host_capacity = 0;
  ts.retained = false;
}

// After a successful restore: a host backup the tag retains stays, with its
// entries, as the contents of the pause; any other goes.
void CachingAllocator::settle_backup_after_resume(TagState& ts) {
  const bool keep = ts.retain && in_host_memory(ts.location) && ts.host != nullptr;
  drop_backup(ts);
  if (keep) ts.retained = true;
  else release_host_buffer(ts);
}

// Retained backups of which no block is live any more (all freed) go back:
// nobody can ask for them (empty_cache).
void CachingAllocator::drop_unused_retained() {
  for (auto& [tag, ts] : tags_) {
    if (!ts.retained) continue;
    bool used = false;
    for (const BackupEntry& e : ts.entries) {
      const Block* b = find_live(e.ptr);
      used = used || (b != nullptr && b->allocated && b->id == e.id);
    }
    if (!used) release_host_buffer(ts);
  }
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

// Two pinned halves big enough for `total` bytes in chunks of at most
// pause_backup_chunk: a small tag does not pin the whole chunk size.
Status CachingAllocator::ensure_staging(std::size_t total, TagState& ts) {
  const std::size_t chunk = std::max<std::size_t>(config_.pause_backup_chunk, 4 * KiB);
  const std::size_t want = std::min(chunk, (total + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
  if (staging_half_ >= want) return kSuccess;
  if (staging_ != nullptr) backend_->host_free(staging_);
  staging_ = nullptr;
  staging_half_ = 0;
  void* p = nullptr;
  const Status st = backend_->host_alloc(2 * want, &p);
  if (st != kSuccess) {
    ts.failure = "cannot allocate the " + std::to_string(2 * want) + " bytes of pinned staging buffers of a disk backup";
    return st;
  }
  staging_ = p;
  staging_half_ = want;
  return kSuccess;
}

Status CachingAllocator::write_disk_backup(TagState& ts, std::size_t total) {
  release_host_buffer(ts);  // the tag moved from host to disk backups: spare that memory
  if (total == 0) return kSuccess;  // nothing live: no file
  Status st = ensure_staging(total, ts);
  if (st != kSuccess) return st;
  const std::string dir = backup_dir(config_);
  int fd = -1;
  st = backend_->file_create(dir.c_str(), total, &fd, &ts.failure);
  if (st != kSuccess) return st;
  const std::size_t chunk = staging_half_;
  auto half = [&](std::size_t k) { return static_cast<unsigned char*>(staging_) + (k % 2) * chunk; };
  const std::size_t chunks = (total + chunk - 1) / chunk;
  for (std::size_t k = 0; k <= chunks && st == kSuccess; ++k) {
    if (k < chunks)  // chunk k: device -> half k%2 (asynchronous) ...
      st = for_pieces(ts.entries, k * chunk, std::min(total, (k + 1) * chunk),
                      [&](const BackupEntry& e, std::size_t in_entry, std::size_t n, std::size_t at) {
                        return backend_->copy_to_host_async(half(k) + at, e.ptr + in_entry, n);
                      });
    if (st == kSuccess && k > 0) {  // ... while chunk k-1 goes from the other half to the file
      const std::size_t lo = (k - 1) * chunk;
      st = backend_->file_write(fd, half(k - 1), std::min(total, lo + chunk) - lo, lo, &ts.failure);
    }
    const Status synced = backend_->copy_synchronize();  // chunk k is in its half; nothing writes the staging after
    if (st == kSuccess) st = synced;
  }
  if (st != kSuccess) {
    backend_->file_close(fd);  // the partial file goes with its space
    return st;
  }
  ts.file = fd;
  return kSuccess;
}

Status CachingAllocator::read_disk_backup(TagState& ts) {
  const std::size_t total = ts.backup_bytes;
  if (total == 0) return kSuccess;
  Status st = ensure_staging(total, ts);
  if (st != kSuccess) return st;
  // Blocks freed while paused are not restored (see read_host_backup).
  std::vector<bool> live(ts.entries.size());
  for (std::size_t i = 0; i < ts.entries.size(); ++i) {
    const Block* b = find_live(ts.entries[i].ptr);
    live[i] = b != nullptr && b->size == ts.entries[i].size;
  }
  const std::size_t chunk = staging_half_;
  auto half = [&](std::size_t k) { return static_cast<unsigned char*>(staging_) + (k % 2) * chunk; };
  const std::size_t chunks = (total + chunk - 1) / chunk;
  for (std::size_t k = 0; k < chunks && st == kSuccess; ++k) {
    const std::size_t lo = k * chunk, hi = std::min(total, lo + chunk);
    // Chunk k from the file into half k%2, while chunk k-1 is copied to the
    // device from the other half; then that copy is done, and chunk k goes.
    st = backend_->file_read(ts.file, half(k), hi - lo, lo, &ts.failure);
    if (st == kSuccess) st = backend_->copy_synchronize();
    if (st == kSuccess)
      st = for_pieces(ts.entries, lo, hi, [&](const BackupEntry& e, std::size_t in_entry, std::size_t n, std::size_t at) {
        if (!live[static_cast<std::size_t>(&e - ts.entries.data())]) return kSuccess;
        return backend_->copy_to_device_async(e.ptr + in_entry, half(k) + at, n);
      });
  }
  const Status synced = backend_->copy_synchronize();  // nothing reads the staging after
  return st != kSuccess ? st : synced;
}

}  // namespace cachalloc
