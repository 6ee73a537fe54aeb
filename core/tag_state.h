// tag_state.h — what the allocator keeps per tag (pause_path.cpp).
//
// A tag's memory lives in segments of its own (block.h); this is the rest:
// whether it is paused, its host backup, and its pause/resume counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "types.h"

namespace cachalloc {

// Per-tag statistics, as reports show them.
struct TagStats {
  TagId tag = kUntagged;
  bool paused = false;
  bool backup = false;                 // backs up its live blocks at pause
  std::size_t segments = 0;
  std::size_t reserved_bytes = 0;      // pages mapped now, or released by the pause (resume maps them)
  std::size_t allocated_bytes = 0;     // live blocks
  std::size_t paused_bytes = 0;        // pages released now
  std::size_t backup_bytes = 0;        // bytes of live blocks held in host memory now
  std::size_t backup_capacity = 0;     // pinned host bytes kept for backups
  std::uint64_t pauses = 0, resumes = 0;
  double pause_seconds = 0, resume_seconds = 0;            // totals
  double last_pause_seconds = 0, last_resume_seconds = 0;
};

// One block's copy in the tag's host buffer.
struct BackupEntry {
  DevicePtr ptr;
  std::size_t size;
  std::size_t offset;  // into TagState::host
};

struct TagState {
  bool paused = false;
  bool backup = false;
  // The pinned buffer is kept between pauses (a pinned allocation costs
  // ~0.8 ms per MiB on an H100: anchors note); backup_valid while it holds
  // the live blocks of the current pause.
  void* host = nullptr;
  std::size_t host_capacity = 0;
  bool backup_valid = false;
  std::vector<BackupEntry> entries;
  std::size_t backup_bytes = 0;
  std::uint64_t pauses = 0, resumes = 0;
  double pause_seconds = 0, resume_seconds = 0;
  double last_pause_seconds = 0, last_resume_seconds = 0;
};

}  // namespace cachalloc
