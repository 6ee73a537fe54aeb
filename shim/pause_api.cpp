// pause_api.cpp — the control API of tags, pause and resume
// (include/cachalloc.h, docs/PAUSE.md): names to core tag ids, every live
// context's allocator, the owner context made current for the driver calls.
#include <cstring>
#include <string>
#include <vector>

#include "cachalloc.h"
#include "capture_tracking.h"
#include "context_registry.h"
#include "guarded.h"
#include "log.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"
#include "tags.h"

#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace cachalloc::shim {
namespace {

std::vector<ContextState*> live_states() {
  std::vector<ContextState*> out;
  for (ContextState* s : all_context_states())
    if (s->alive()) out.push_back(s);
  return out;
}

// The ids `name` means: one tag and its variants (tags.h), or every tag
// pausing all takes for NULL.  False: a bad name or "" (the untagged memory
// is never paused).
bool tags_named(const char* name, std::vector<TagId>* out) {
  if (name == nullptr) {
    *out = all_tags();
    return true;
  }
  const TagId id = tag_id(name);
  if (id == kUntagged || id == kBadTag) return false;
  *out = tag_and_variants(id);
  return true;
}

// Pause or resume of one core tag in one context, the tag's settings
// (backup mode, retain, backup files) handed to its allocator first.
Status pause_or_resume_one(ContextState* s, TagId id, bool pause, bool* no_op) {
  CachingAllocator& a = s->allocator();
  a.set_tag_retain_backup(id, tag_retain(id));  // (read by the resume, as torch_memory_saver's flag)
  if (!pause) return a.resume(id, no_op);
  a.set_tag_backup(id, tag_backup(id));
  apply_backup_files(a);
  return a.pause(id, no_op);
}

void log_failure(const char* what, TagId id, ContextState* s, Status st, bool pause) {
  CachingAllocator& a = s->allocator();
  const std::string why = a.tag_failure(id);
  obs::logger().error("{}('{}') on device {}: {} {}{}; the tag is left {}{} (docs/PAUSE.md)", what,
                      tag_display_name(id), s->device(),
                      st == kOperatingSystem ? "backup file error" : st == kInvalidValue ? "refused" : "driver error",
                      st, why.empty() ? "" : ": " + why, a.tag_paused(id) ? "paused" : "running",
                      pause ? (a.tag_paused(id) ? "" : " with its contents") : ", its backup kept for a retry");
}

// Runs pause or resume of `name` in every live context; the first error is
// returned, the other contexts are still handled (each stays consistent).
int pause_or_resume(const char* name, bool pause) {
  if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
  std::vector<TagId> ids;
  if (!tags_named(name, &ids)) return CACHALLOC_ERROR_INVALID_VALUE;
  if (!caching(current_mode())) return CACHALLOC_SUCCESS;  // nothing served, nothing to do
  if (strict_capture_in_flight()) return CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  const char* what = pause ? "cachalloc_pause" : "cachalloc_resume";
  const RealDriver* d = real_driver();
  int first_error = CACHALLOC_SUCCESS;
  bool all_no_op = true;  // (a name's variants count as the name)
  for (TagId id : ids) {
    for (ContextState* s : live_states()) {
      ContextGuard guard(d, s->context());
      bool no_op = false;
      const Status st = pause_or_resume_one(s, id, pause, &no_op);
      all_no_op = all_no_op && no_op;
      if (st != kSuccess) {
        log_failure(what, id, s, st, pause);
        if (first_error == CACHALLOC_SUCCESS) first_error = st;
      }
    }
  }
  if (all_no_op && name != nullptr)
    obs::logger().warn("{}('{}'): the tag is already {}; nothing done", what, name, pause ? "paused" : "running");
  return first_error;
}

}  // namespace
}  // namespace cachalloc::shim

using namespace cachalloc;
using namespace cachalloc::shim;

CACHALLOC_EXPORT int cachalloc_set_tag(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = tag_id(tag);
    if (id == kBadTag) return CACHALLOC_ERROR_INVALID_VALUE;
    set_thread_tag(id);
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_get_tag(char* buf, size_t len) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const std::string name = tag_name(current_tag());  // (a variant's: its name)
    if (buf == nullptr || len == 0) return CACHALLOC_ERROR_INVALID_VALUE;
    const std::size_t n = std::min(len - 1, name.size());
    std::memcpy(buf, name.data(), n);
    buf[n] = '\0';
    return n == name.size() ? CACHALLOC_SUCCESS : CACHALLOC_ERROR_INVALID_VALUE;
  });
}

CACHALLOC_EXPORT int cachalloc_set_tag_backup(const char* tag, int enable) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = tag_id(tag);
    if (id == kBadTag || id == kUntagged) return CACHALLOC_ERROR_INVALID_VALUE;
    if (enable < CACHALLOC_BACKUP_NONE || enable > CACHALLOC_BACKUP_PAGEABLE) return CACHALLOC_ERROR_INVALID_VALUE;
    set_tag_backup(id, static_cast<BackupMode>(enable));
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_pause(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] { return pause_or_resume(tag, true); });
}

CACHALLOC_EXPORT int cachalloc_resume(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] { return pause_or_resume(tag, false); });
}

CACHALLOC_EXPORT int cachalloc_tag_paused(const char* tag) {
  return guarded(CACHALLOC_ERROR_UNKNOWN, [&] {
    if (in_forked_child()) return -CACHALLOC_ERROR_NOT_INITIALIZED;  // before the tags' lock
    const TagId id = tag_id(tag);
    if (id == kBadTag || id == kUntagged) return -CACHALLOC_ERROR_INVALID_VALUE;
    for (TagId t : tag_and_variants(id))
      for (ContextState* s : live_states())
        if (s->allocator().tag_paused(t)) return 1;
    return 0;
  });
}
