// tags.cpp — tag names, the thread's tag, and the tagged allocation path
// (tags.h).
#include "tags.h"

#include <cctype>
#include <mutex>

#include "log.h"

namespace cachalloc::shim {

constinit thread_local TagId detail::t_tag __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<TagId> detail::g_process_tag{0};

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::string> names;  // id i+1 is names[i]
  std::vector<BackupMode> backup;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: used until exit
  return *r;
}

bool valid_name(const char* name) {
  std::size_t n = 0;
  for (const char* p = name; *p != '\0'; ++p, ++n) {
    const unsigned char ch = static_cast<unsigned char>(*p);
    if (n >= 63 || !(std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.')) return false;
  }
  return true;
}

}  // namespace

TagId current_tag() {
  const TagId t = detail::t_tag;
  if (t == detail::kExplicitUntagged) return kUntagged;
  return t != 0 ? t : detail::g_process_tag.load(std::memory_order_relaxed);
}

TagId tag_id(const char* name) {
  if (name == nullptr || *name == '\0') return kUntagged;
  if (!valid_name(name)) return kBadTag;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (std::size_t i = 0; i < r.names.size(); ++i)
    if (r.names[i] == name) return static_cast<TagId>(i + 1);
  r.names.emplace_back(name);
  r.backup.push_back(BackupMode::none);
  return static_cast<TagId>(r.names.size());
}

std::string tag_name(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return id >= 1 && id <= r.names.size() ? r.names[id - 1] : std::string();
}

std::vector<TagId> all_tags() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<TagId> out;
  for (std::size_t i = 0; i < r.names.size(); ++i) out.push_back(static_cast<TagId>(i + 1));
  return out;
}

void set_thread_tag(TagId id) { detail::t_tag = id == kUntagged ? detail::kExplicitUntagged : id; }

void set_tag_backup(TagId id, BackupMode backup) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id >= 1 && id <= r.backup.size()) r.backup[id - 1] = backup;
}

BackupMode tag_backup(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return id >= 1 && id <= r.backup.size() ? r.backup[id - 1] : BackupMode::none;
}

void apply_config_tag(const Config& config) {
  if (config.tag.empty()) return;
  const TagId id = tag_id(config.tag.c_str());
  if (id == kBadTag) return;  // the parser accepted only valid names
  set_tag_backup(id, config.tag_cpu_backup);
  detail::g_process_tag.store(id, std::memory_order_relaxed);
}

Status malloc_in_current_tag(CachingAllocator& a, DevicePtr* out, std::size_t size, StreamId stream) {
  const TagId tag = current_tag();
  const Status st = a.malloc_tagged(out, size, stream, tag);
  if (st != kTagPaused) [[likely]] return st;
  obs::logger().warn("allocation of {} bytes in tag '{}' refused: the tag is paused (cachalloc_pause); answering "
                     "CUDA_ERROR_OUT_OF_MEMORY until cachalloc_resume",
                     size, tag_name(tag));
  return kOutOfMemory;
}

}  // namespace cachalloc::shim
