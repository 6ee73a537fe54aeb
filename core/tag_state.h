// tag_state.h — what the allocator keeps per tag (pause_path.cpp).
//
// A tag's memory lives in segments of its own (block.h); this is the rest:
// whether it is paused, its backup (host memory or a file), and its
// pause/resume counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "types.h"

namespace cachalloc {

// Per-tag statistics, as reports show them.
struct TagStats {
  TagId tag = kUntagged;
  bool paused = false;
  bool backup = false;                 // backs up its live blocks at pause (mode != none)
  bool retain = false;                 // a host backup outlives the resume (TagState::retain)
  BackupMode backup_mode = BackupMode::none;      // where its next pause puts the backup
  BackupMode backup_location = BackupMode::none;  // where the backup held now lives (none: no backup held)
  std::size_t segments = 0;
  std::size_t reserved_bytes = 0;      // pages mapped now, or released by the pause (resume maps them)
  std::size_t allocated_bytes = 0;     // live blocks
  std::size_t paused_bytes = 0;        // pages released now
  std::size_t backup_bytes = 0;        // bytes of live blocks backed up now (host memory or file)
  std::size_t backup_capacity = 0;     // host bytes (pinned or pageable) of its backup buffer
  std::size_t retained_bytes = 0;      // of backup_capacity, a backup kept past its resume (retain)
  std::size_t disk_bytes = 0;          // of backup_bytes, those in the backup files
  std::size_t disk_files = 0;          // files of the disk backup held now
  std::size_t staging_bytes = 0;       // pinned staging buffers of disk backups (per device, shared by its tags)
  std::uint64_t pauses = 0, resumes = 0;
  double pause_seconds = 0, resume_seconds = 0;            // totals
  double last_pause_seconds = 0, last_resume_seconds = 0;
};

// One block's copy in the tag's backup: at `offset` of the host buffer or
// of the file.  Entries lie end to end in offset order.  `id` is the
// block's allocation serial (Block::id): a retained backup answers a lookup
// (backup_pointer) only for the very allocation it copied, never for a
// later one at the same address.
struct BackupEntry {
  DevicePtr ptr;
  std::size_t size;
  std::size_t offset;
  std::uint64_t id = 0;
};

// One file of a disk backup (TagState::files).
struct BackupFile {
  int fd = -1;       // -1: a named file closed between its writes and reads
  std::size_t start = 0;
  std::size_t size = 0;
  std::string path;  // "" for a nameless file
};

struct TagState {
  bool paused = false;
  BackupMode backup = BackupMode::none;  // asked for: where the next pause puts it
  // The host buffer (pinned, or pageable: host_kind) of host backups;
  // backup_valid while it (or the file) holds the live blocks of the
  // current pause, at `location`.  A resume gives it back (the process's
  // host memory drops, as torch_memory_saver's does) unless `retain`: then
  // it stays, `retained`, holding the contents as of the pause, for
  // backup_pointer() and for the next pause to refill at the same address
  // (no new pinned allocation, ~0.8 ms per MiB on an H100).
  void* host = nullptr;
  std::size_t host_capacity = 0;
  BackupMode host_kind = BackupMode::host;
  bool retain = false;
  bool retained = false;
  // The live blocks a held backup copied (paused with one, or retained):
  // address -> allocation serial.  Freeing the last of them drops the
  // backup and gives its memory back (torch_memory_saver frees an
  // allocation's backup with it): nobody can restore or ask for it.
  std::unordered_map<DevicePtr, std::uint64_t> backup_blocks;
  // The files of a disk backup covering its bytes [start, start+size) in
  // order (pause_disk.cpp): from the pause until the resume that restored
  // it (their space then goes back), none otherwise.  One nameless file
  // (backup_file.cpp: nothing outlives the process), open throughout; or a
  // named one per live block, open only while bytes go through it.
  std::vector<BackupFile> files;
  bool backup_valid = false;
  BackupMode location = BackupMode::none;
  std::vector<BackupEntry> entries;
  std::size_t backup_bytes = 0;
  // Why the last pause or resume failed, when the system said more than a
  // status code does (a backup file's errno text); "" otherwise.
  std::string failure;
  std::uint64_t pauses = 0, resumes = 0;
  double pause_seconds = 0, resume_seconds = 0;
  double last_pause_seconds = 0, last_resume_seconds = 0;
};

}  // namespace cachalloc
