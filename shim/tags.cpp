// tags.cpp — tag names and their variants, per-tag settings, the thread's
// tag, and the tagged allocation path (tags.h).
#include "tags.h"

#include <cctype>
#include <mutex>
#include <optional>

#include "log.h"

namespace cachalloc::shim {

constinit thread_local TagId detail::t_tag __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<TagId> detail::g_process_tag{0};

namespace {

// One tag id: a named tag, or a variant of one (a name with a backup mode
// of its own, tag_variant).  Per-name settings (retain, pause-all) live on
// the named tag's entry.
struct TagEntry {
  std::string name;
  TagId base = 0;           // the named tag's id (its own for a named tag)
  bool variant = false;
  BackupMode backup = BackupMode::none;  // a variant's is fixed
  std::optional<bool> retain;            // unset: the process default
  bool in_pause_all = true;
};

struct Registry {
  std::mutex mutex;
  std::vector<TagEntry> tags;  // id i+1 is tags[i]
  // Host backups outlive the resume unless a tag says otherwise: the next
  // pause refills the buffer at the link's speed, where a new pinned
  // buffer costs ~0.8 ms per MiB (docs/PAUSE.md).  torch_memory_saver
  // gives them back by default; its drop-in (cachalloc.tms_compat) sets
  // that, and TMS_RETAIN_CPU_BACKUP, read when the first tag call is made
  // as TMS reads it, wins over both.
  bool default_retain = tms_env_bool("TMS_RETAIN_CPU_BACKUP").value_or(true);
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: used until exit
  return *r;
}

const char* backup_mode_word(BackupMode m) {
  switch (m) {
    case BackupMode::host: return "host";
    case BackupMode::pageable: return "pageable";
    case BackupMode::disk: return "disk";
    default: return "none";
  }
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
  for (std::size_t i = 0; i < r.tags.size(); ++i)
    if (!r.tags[i].variant && r.tags[i].name == name) return static_cast<TagId>(i + 1);
  const auto id = static_cast<TagId>(r.tags.size() + 1);
  r.tags.push_back(TagEntry{.name = name, .base = id});
  return id;
}

TagId tag_variant(TagId base, BackupMode backup) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (base < 1 || base > r.tags.size() || r.tags[base - 1].variant) return kBadTag;
  for (std::size_t i = 0; i < r.tags.size(); ++i)
    if (r.tags[i].variant && r.tags[i].base == base && r.tags[i].backup == backup) return static_cast<TagId>(i + 1);
  r.tags.push_back(TagEntry{.name = r.tags[base - 1].name, .base = base, .variant = true, .backup = backup});
  return static_cast<TagId>(r.tags.size());
}

std::string tag_name(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return id >= 1 && id <= r.tags.size() ? r.tags[id - 1].name : std::string();
}

std::string tag_display_name(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id < 1 || id > r.tags.size()) return std::string();
  const TagEntry& e = r.tags[id - 1];
  return e.variant ? e.name + "+" + backup_mode_word(e.backup) : e.name;
}

TagId tag_base(TagId id, BackupMode* fixed, bool* is_variant) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id < 1 || id > r.tags.size()) return kUntagged;
  const TagEntry& e = r.tags[id - 1];
  if (fixed != nullptr) *fixed = e.backup;
  if (is_variant != nullptr) *is_variant = e.variant;
  return e.base;
}

std::vector<TagId> all_tags() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<TagId> out;
  for (std::size_t i = 0; i < r.tags.size(); ++i)
    if (r.tags[r.tags[i].base - 1].in_pause_all) out.push_back(static_cast<TagId>(i + 1));
  return out;
}

std::vector<TagId> tag_and_variants(TagId base) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<TagId> out;
  for (std::size_t i = 0; i < r.tags.size(); ++i)
    if (r.tags[i].base == base) out.push_back(static_cast<TagId>(i + 1));
  return out;
}

void set_thread_tag(TagId id) { detail::t_tag = id == kUntagged ? detail::kExplicitUntagged : id; }

void set_tag_backup(TagId id, BackupMode backup) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id >= 1 && id <= r.tags.size() && !r.tags[id - 1].variant) r.tags[id - 1].backup = backup;
}

BackupMode tag_backup(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return id >= 1 && id <= r.tags.size() ? r.tags[id - 1].backup : BackupMode::none;
}

void set_tag_retain(TagId id, bool retain) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id == kUntagged) {  // every tag, those named later too
    r.default_retain = retain;
    for (TagEntry& e : r.tags) e.retain.reset();
  } else if (id <= r.tags.size()) {
    r.tags[r.tags[id - 1].base - 1].retain = retain;
  }
}

bool tag_retain(TagId id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id < 1 || id > r.tags.size()) return r.default_retain;
  return r.tags[r.tags[id - 1].base - 1].retain.value_or(r.default_retain);
}

void set_tag_in_pause_all(TagId id, bool included) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (id >= 1 && id <= r.tags.size()) r.tags[r.tags[id - 1].base - 1].in_pause_all = included;
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
