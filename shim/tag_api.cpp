// tag_api.cpp — the control API of tags beyond pause and resume
// (include/cachalloc.h, docs/PAUSE.md): a backup mode per allocation (tag
// variants, tags.h), retained host backups and where a block's bytes are in
// one, the directory and naming of disk backup files, one tag's cache, the
// tags that pausing every tag leaves out, and the memory margin of tagged
// allocations.  torch_memory_saver's drop-in (python/cachalloc/
// memory_saver.py) is built on these.
//
// Process-wide settings live here and reach each context's allocator when
// it needs them: the backup files before each pause (pause_api.cpp), the
// margin at the allocator's creation and when it changes.
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cachalloc.h"
#include "capture_tracking.h"
#include "context_registry.h"
#include "guarded.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"
#include "tags.h"

#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace cachalloc::shim {
namespace {

struct Settings {
  std::mutex mutex;
  std::string backup_dir;  // "" = the configuration's pause_backup_dir
  bool named_files = false;
  bool files_set = false;  // by the API: the environment no longer decides them
  std::atomic<std::size_t> margin{0};
};

Settings& settings() {
  static Settings* s = new Settings;  // never destroyed: read until exit
  return *s;
}

std::vector<ContextState*> live_states() {
  std::vector<ContextState*> out;
  for (ContextState* s : all_context_states())
    if (s->alive()) out.push_back(s);
  return out;
}

// The named tag `name` means; kBadTag for a bad name, NULL or "" (the
// untagged memory has none of these settings).
TagId named_tag(const char* name) {
  const TagId id = tag_id(name);
  return id == kUntagged ? kBadTag : id;
}

}  // namespace

void set_backup_files(const std::string& dir, bool named) {
  Settings& s = settings();
  std::lock_guard lock(s.mutex);
  s.backup_dir = dir;
  s.named_files = named;
  s.files_set = true;
}

void set_backup_files_if_unset(const std::string& dir, bool named) {
  Settings& s = settings();
  std::lock_guard lock(s.mutex);
  if (s.files_set) return;
  s.backup_dir = dir;
  s.named_files = named;
}

void apply_backup_files(CachingAllocator& a) {
  Settings& s = settings();
  std::lock_guard lock(s.mutex);
  a.set_backup_files(s.backup_dir, s.named_files);
}

void apply_tag_settings(CachingAllocator& a) { a.set_tag_memory_margin(settings().margin.load()); }

}  // namespace cachalloc::shim

using namespace cachalloc;
using namespace cachalloc::shim;

CACHALLOC_EXPORT int cachalloc_set_tag_with_backup(const char* tag, int backup) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = tag_id(tag);
    if (id == kBadTag || backup < CACHALLOC_TAG_PROCESS || backup > CACHALLOC_BACKUP_PAGEABLE)
      return CACHALLOC_ERROR_INVALID_VALUE;
    if (backup == CACHALLOC_TAG_PROCESS) {  // (a saved state restored: the name does not matter)
      clear_thread_tag();
      return CACHALLOC_SUCCESS;
    }
    if (id == kUntagged && backup != CACHALLOC_BACKUP_TAG) return CACHALLOC_ERROR_INVALID_VALUE;
    set_thread_tag(backup == CACHALLOC_BACKUP_TAG ? id : tag_variant(id, static_cast<BackupMode>(backup)));
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_get_tag_with_backup(char* buf, size_t len, int* backup) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    if (buf == nullptr || len == 0 || backup == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    const TagId id = current_tag();
    BackupMode fixed = BackupMode::none;
    bool is_variant = false;
    tag_base(id, &fixed, &is_variant);
    *backup = !thread_has_tag() ? CACHALLOC_TAG_PROCESS : is_variant ? static_cast<int>(fixed) : CACHALLOC_BACKUP_TAG;
    const std::string name = tag_name(id);
    const std::size_t n = std::min(len - 1, name.size());
    std::memcpy(buf, name.data(), n);
    buf[n] = '\0';
    return n == name.size() ? CACHALLOC_SUCCESS : CACHALLOC_ERROR_INVALID_VALUE;
  });
}

CACHALLOC_EXPORT int cachalloc_set_tag_retain_backup(const char* tag, int retain) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    if (retain != 0 && retain != 1) return CACHALLOC_ERROR_INVALID_VALUE;
    const TagId id = tag == nullptr ? kUntagged : named_tag(tag);
    if (id == kBadTag) return CACHALLOC_ERROR_INVALID_VALUE;
    set_tag_retain(id, retain == 1);  // read by the next resume (pause_api.cpp)
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_get_tag_retain_backup(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return -CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = tag == nullptr ? kUntagged : named_tag(tag);
    if (id == kBadTag) return -CACHALLOC_ERROR_INVALID_VALUE;
    return tag_retain(id) ? 1 : 0;
  });
}

CACHALLOC_EXPORT int cachalloc_get_backup_pointer(const void* ptr, size_t size, void** host) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (host == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    *host = nullptr;
    if (in_forked_child() || !caching(current_mode())) return CACHALLOC_ERROR_NOT_INITIALIZED;
    const auto p = reinterpret_cast<DevicePtr>(ptr);
    for (ContextState* s : live_states()) {
      void* h = nullptr;
      const Status st = s->allocator().backup_pointer(p, size, &h);
      if (st == kNotOwned) continue;
      if (st != kSuccess) return CACHALLOC_ERROR_INVALID_VALUE;
      *host = h;
      return CACHALLOC_SUCCESS;
    }
    return CACHALLOC_ERROR_INVALID_VALUE;  // no cachalloc memory
  });
}

CACHALLOC_EXPORT int cachalloc_set_pause_backup_dir(const char* dir, int named) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the settings' lock
    if (named != 0 && named != 1) return CACHALLOC_ERROR_INVALID_VALUE;
    set_backup_files(dir == nullptr ? std::string() : std::string(dir), named == 1);
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_empty_tag_cache(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = named_tag(tag);
    if (id == kBadTag) return CACHALLOC_ERROR_INVALID_VALUE;
    if (!caching(current_mode())) return CACHALLOC_ERROR_NOT_INITIALIZED;
    // It waits on events and unmaps pages: as cachalloc_empty_cache, unsafe
    // while a global- or thread-local-mode capture is in flight.
    if (strict_capture_in_flight()) return CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const RealDriver* d = real_driver();
    for (TagId t : tag_and_variants(id))
      for (ContextState* s : live_states()) {
        ContextGuard guard(d, s->context());
        s->allocator().empty_tag_cache(t);
      }
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_set_tag_in_pause_all(const char* tag, int included) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = named_tag(tag);
    if (id == kBadTag || (included != 0 && included != 1)) return CACHALLOC_ERROR_INVALID_VALUE;
    set_tag_in_pause_all(id, included == 1);
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_set_memory_margin(size_t bytes) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the registry's lock
    settings().margin.store(bytes);
    for (ContextState* s : live_states()) s->allocator().set_tag_memory_margin(bytes);
    return CACHALLOC_SUCCESS;
  });
}
