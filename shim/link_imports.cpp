// link_imports.cpp — reads the driver names each loaded object binds at
// link time, and fences what no hook sees (link_imports.h).
//
// The relocations say what an object imports: an undefined symbol named
// by a PLT (DT_JMPREL) or data (DT_RELA / DT_REL) relocation.  Only names
// libcuda defines count (cuBLAS's and cuFile's "cu" names are not driver
// calls), and of those only the ones cachalloc does not export (the
// preload answers those) and that are not known to name no stream
// (stream_watch.h).
#include "link_imports.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <atomic>
#include <mutex>
#include <set>

#include "context_registry.h"
#include "log.h"
#include "process_state.h"
#include "real_driver.h"
#include "stream_watch.h"

namespace cachalloc::shim {
namespace {

std::mutex g_mutex;                           // guards the rest
std::atomic<unsigned long long> g_objects_seen{~0ULL};  // dlpi_adds at the last look
std::set<std::string> g_unseen;               // unseen imports found so far
std::atomic<bool> g_any_unseen{false};

// The dynamic section's addresses: glibc relocates most of them in place,
// the vDSO's and a few loaders' are left relative to the load address.
uintptr_t absolute(const dl_phdr_info* info, ElfW(Addr) p) {
  return p < info->dlpi_addr ? info->dlpi_addr + p : p;
}

struct Imports {
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  uintptr_t jmprel = 0, rela = 0, rel = 0;
  size_t jmprel_size = 0, rela_size = 0, rel_size = 0;
  bool plt_is_rela = true;
};

Imports read_dynamic(const dl_phdr_info* info, const ElfW(Dyn)* dyn) {
  Imports m;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    const ElfW(Addr) p = dyn->d_un.d_ptr;
    switch (dyn->d_tag) {
      case DT_SYMTAB: m.symtab = reinterpret_cast<const ElfW(Sym)*>(absolute(info, p)); break;
      case DT_STRTAB: m.strtab = reinterpret_cast<const char*>(absolute(info, p)); break;
      case DT_JMPREL: m.jmprel = absolute(info, p); break;
      case DT_PLTRELSZ: m.jmprel_size = dyn->d_un.d_val; break;
      case DT_PLTREL: m.plt_is_rela = dyn->d_un.d_val == DT_RELA; break;
      case DT_RELA: m.rela = absolute(info, p); break;
      case DT_RELASZ: m.rela_size = dyn->d_un.d_val; break;
      case DT_REL: m.rel = absolute(info, p); break;
      case DT_RELSZ: m.rel_size = dyn->d_un.d_val; break;
      default: break;
    }
  }
  return m;
}

// A driver API name: "cu" and a capital (cublas*, cuda*, cufft* are not).
bool driver_like(const char* name) { return name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z'; }

// ELF64_R_SYM / ELF32_R_SYM, for the word size of this process.
#if __SIZEOF_POINTER__ == 8
constexpr size_t symbol_index(uint64_t info) { return ELF64_R_SYM(info); }
#else
constexpr size_t symbol_index(uint32_t info) { return ELF32_R_SYM(info); }
#endif

template <typename Rel>
void collect(const Imports& m, uintptr_t table, size_t bytes, std::set<std::string>* out) {
  if (table == 0 || m.symtab == nullptr || m.strtab == nullptr) return;
  const auto* r = reinterpret_cast<const Rel*>(table);
  for (size_t i = 0, n = bytes / sizeof(Rel); i < n; ++i) {
    const size_t index = symbol_index(r[i].r_info);
    if (index == 0) continue;
    const ElfW(Sym)& s = m.symtab[index];
    if (s.st_shndx != SHN_UNDEF) continue;
    const char* name = m.strtab + s.st_name;
    if (driver_like(name)) out->insert(name);
  }
}

struct Scan {
  uintptr_t self_base;
  std::set<std::string> names;
};

int scan_object(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<Scan*>(data);
  if (info->dlpi_addr == scan->self_base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const auto* dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    const Imports m = read_dynamic(info, dyn);
    if (m.plt_is_rela)
      collect<ElfW(Rela)>(m, m.jmprel, m.jmprel_size, &scan->names);
    else
      collect<ElfW(Rel)>(m, m.jmprel, m.jmprel_size, &scan->names);
    collect<ElfW(Rela)>(m, m.rela, m.rela_size, &scan->names);
    collect<ElfW(Rel)>(m, m.rel, m.rel_size, &scan->names);
  }
  return 0;
}

int count_objects(dl_phdr_info* info, size_t, void* data) {
  *static_cast<unsigned long long*>(data) = info->dlpi_adds;
  return 1;  // dlpi_adds is the same in every callback: one is enough
}

uintptr_t self_base() {
  Dl_info me{};
  if (dladdr(reinterpret_cast<void*>(&check_link_imports), &me) == 0) return 0;
  return reinterpret_cast<uintptr_t>(me.dli_fbase);
}

// Whether the dynamic linker bound `name` to cachalloc (it exports it).
bool bound_to_cachalloc(const char* name, uintptr_t base) {
  void* sym = real_dlsym(RTLD_DEFAULT, name);
  Dl_info where{};
  return sym != nullptr && dladdr(sym, &where) != 0 && reinterpret_cast<uintptr_t>(where.dli_fbase) == base;
}

// The imports, of all objects loaded now, that work could pass unseen.
std::vector<std::string> unseen_now() {
  Scan scan{self_base(), {}};
  dl_iterate_phdr(scan_object, &scan);
  void* libcuda = loaded_libcuda_handle();
  std::vector<std::string> out;
  if (libcuda == nullptr) return out;
  for (const std::string& n : scan.names)
    if (real_dlsym(libcuda, n.c_str()) != nullptr && !bound_to_cachalloc(n.c_str(), scan.self_base) &&
        !names_no_stream(n.c_str()))
      out.push_back(n);
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Every live context leaves the single sequence (each current meanwhile:
// the serial-end event is recorded on its legacy stream).
void fence_live_contexts() {
  for (ContextState* s : live_context_states()) {
    ContextGuard guard(real_driver(), s->context());
    s->note_unseen_streams();
  }
}

// The objects loaded since the last look, read (one pass of the loader's
// list, a lock and a callback, when nothing was loaded).
void look() noexcept {
  unsigned long long adds = 0;
  dl_iterate_phdr(count_objects, &adds);
  if (adds == g_objects_seen.load(std::memory_order_acquire)) return;
  try {
    std::lock_guard lock(g_mutex);
    if (adds == g_objects_seen.load(std::memory_order_relaxed)) return;
    std::vector<std::string> fresh;
    for (std::string& n : unseen_now())
      if (g_unseen.insert(n).second) fresh.push_back(std::move(n));
    // Marked seen only once its fences are in place: a caller that finds
    // the count unchanged may rely on them.
    struct MarkSeen {
      unsigned long long adds;
      ~MarkSeen() { g_objects_seen.store(adds, std::memory_order_release); }
    } mark{adds};
    if (fresh.empty()) return;
    obs::logger().warn(
        "a loaded object imports driver entry points newer than cachalloc's CUDA headers ({}): work they put on a "
        "per-thread default stream cannot be seen, so plain frees wait for fences from here on (memory, not "
        "correctness; docs/INTERPOSER.md)",
        joined(fresh));
    g_any_unseen.store(true, std::memory_order_release);
    fence_live_contexts();
  } catch (...) {
    // Out of memory while reading names: assume the worst.
    g_any_unseen.store(true, std::memory_order_release);
  }
}

}  // namespace

void check_link_imports() noexcept {
  if (detail::g_mode.load(std::memory_order_acquire) == Mode::active) look();
}

void check_link_imports_at_start() noexcept { look(); }

bool unseen_link_imports() noexcept { return g_any_unseen.load(std::memory_order_acquire); }

void note_streams_outside_contexts() noexcept { g_any_unseen.store(true, std::memory_order_release); }

std::vector<std::string> unseen_link_import_names() {
  std::lock_guard lock(g_mutex);
  return {g_unseen.begin(), g_unseen.end()};
}

}  // namespace cachalloc::shim
