// pause_disk.cpp — disk backups of paused tags (pause_backup.cpp,
// docs/PAUSE.md "Disk backups"), for tags larger than the host memory to
// spare.
//
// The backup's bytes (TagState::entries, end to end) live in the backup
// directory (set_backup_files(), else pause_backup_dir, else $TMPDIR, else
// /tmp), in files covering them in order (TagState::files):
//   nameless (the default, backup_file.cpp)  one file per tag, open from the
//            pause to the resume: it has no name to be opened again by;
//   named    one file per live block, as torch_memory_saver keeps one per
//            allocation (with PyTorch's cache in front a block is one of
//            its segments): what TMS's users see of their tensors on disk.
//            A named file is open only while bytes go through it, so a tag
//            of thousands of blocks holds one descriptor, not thousands.
// All files are created, their space reserved, before a byte is copied, so
// that a full disk fails the pause before anything moves.
//
// The bytes go through two pinned staging halves of at most
// pause_backup_chunk bytes each (the device's) whatever the tag's size:
// while the device copies chunk k into one half, chunk k-1 goes from the
// other half to the files (one copy in flight at a time, so
// copy_synchronize waits for exactly that one); a resume reads chunk k into
// one half while chunk k-1 is copied to the device from the other.  A chunk
// that spans several files is one write (read) per file.  The files live
// from the pause to the resume that restored them.
#include <algorithm>
#include <cstdlib>

#include "caching_allocator.h"

namespace cachalloc {

namespace {

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

void CachingAllocator::set_backup_files(std::string dir, bool named) {
  std::lock_guard lock(mutex_);
  backup_dir_ = std::move(dir);
  backup_files_named_ = named;
}

// The directory of backup files: set_backup_files(), else pause_backup_dir,
// else $TMPDIR, else /tmp.
std::string CachingAllocator::backup_dir() const {
  if (!backup_dir_.empty()) return backup_dir_;
  if (!config_.pause_backup_dir.empty()) return config_.pause_backup_dir;
  const char* t = std::getenv("TMPDIR");
  return t != nullptr && *t != '\0' ? std::string(t) : std::string("/tmp");
}

// Every file of the tag's disk backup goes, with its space (and its name).
void CachingAllocator::close_backup_files(TagState& ts) {
  for (const BackupFile& f : ts.files) {
    if (!f.path.empty()) backend_->file_unlink(f.path);
    if (f.fd >= 0) backend_->file_close(f.fd);
  }
  ts.files.clear();
}

// The files of a backup of `total` bytes (see the top of this file).
Status CachingAllocator::create_backup_files(TagState& ts, std::size_t total) {
  std::vector<std::size_t> sizes;
  if (backup_files_named_)
    for (const BackupEntry& e : ts.entries) sizes.push_back(e.size);
  else
    sizes.push_back(total);
  const std::string dir = backup_dir();
  std::size_t start = 0;
  for (std::size_t bytes : sizes) {
    BackupFile f;
    f.start = start;
    f.size = bytes;
    const Status st =
        backend_->file_create(dir.c_str(), bytes, &f.fd, &ts.failure, backup_files_named_ ? &f.path : nullptr);
    if (st != kSuccess) {  // (a file that failed is gone already: backup_file.cpp)
      close_backup_files(ts);
      return st;
    }
    if (!f.path.empty()) {
      backend_->file_close(f.fd);  // opened again while bytes go through it (file_io)
      f.fd = -1;
    }
    ts.files.push_back(std::move(f));
    start += bytes;
  }
  return kSuccess;
}

// Moves the backup's bytes [lo, hi) between `buf` and the files: writes
// (write) or reads; a named file is opened when reached and closed once
// its last byte went through (files are walked in order, chunk after chunk).
Status CachingAllocator::file_io(TagState& ts, std::size_t lo, std::size_t hi, unsigned char* buf, bool write) {
  auto it = std::upper_bound(ts.files.begin(), ts.files.end(), lo,
                             [](std::size_t at, const BackupFile& f) { return at < f.start + f.size; });
  for (; it != ts.files.end() && it->start < hi; ++it) {
    BackupFile& f = *it;
    const std::size_t from = std::max(lo, f.start), to = std::min(hi, f.start + f.size);
    Status st = f.fd >= 0 ? kSuccess : backend_->file_open(f.path, &f.fd, &ts.failure);
    if (st == kSuccess)
      st = write ? backend_->file_write(f.fd, buf + (from - lo), to - from, from - f.start, &ts.failure)
                 : backend_->file_read(f.fd, buf + (from - lo), to - from, from - f.start, &ts.failure);
    if (!f.path.empty() && f.fd >= 0 && (st != kSuccess || to == f.start + f.size)) {
      backend_->file_close(f.fd);
      f.fd = -1;
    }
    if (st != kSuccess) return st;
  }
  return kSuccess;
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
  if (st == kSuccess) st = create_backup_files(ts, total);
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
    if (st == kSuccess && k > 0) {  // ... while chunk k-1 goes from the other half to the files
      const std::size_t lo = (k - 1) * chunk;
      st = file_io(ts, lo, std::min(total, lo + chunk), half(k - 1), true);
    }
    const Status synced = backend_->copy_synchronize();  // chunk k is in its half; nothing writes the staging after
    if (st == kSuccess) st = synced;
  }
  if (st != kSuccess) close_backup_files(ts);  // the partial files go with their space
  return st;
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
    st = file_io(ts, lo, hi, half(k), false);
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
