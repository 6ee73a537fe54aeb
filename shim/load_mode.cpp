// load_mode.cpp — see load_mode.h.
#include "load_mode.h"

#include <dlfcn.h>
#include <strings.h>

#include <cstdlib>
#include <initializer_list>

#include "real_driver.h"

namespace cachalloc::shim {
namespace {

// The load address of this copy (any function of it will do).
void* own_base() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_base), &info) == 0) return nullptr;
  return info.dli_fbase;
}

// The load address of the object defining `sym`, or nullptr.
void* base_of(void* sym) {
  if (sym == nullptr) return nullptr;
  Dl_info info{};
  if (dladdr(sym, &info) == 0) return nullptr;
  return info.dli_fbase;
}

// 1: on, 0: off, -1: auto.
int override_from_environment() {
  const char* v = std::getenv("CACHALLOC_INTERCEPT");
  if (v == nullptr || *v == '\0') return -1;
  for (const char* on : {"1", "on", "true", "yes"})
    if (strcasecmp(v, on) == 0) return 1;
  for (const char* off : {"0", "off", "false", "no"})
    if (strcasecmp(v, off) == 0) return 0;
  return -1;
}

}  // namespace

bool interception_wanted() {
  const int forced = override_from_environment();
  if (forced >= 0) return forced == 1;
  // glibc's dlsym resolves RTLD_DEFAULT in the caller's scope: the global
  // scope first (the main link map: program, preloads, DT_NEEDED libraries;
  // then RTLD_GLOBAL objects), and for an RTLD_LOCAL object its own scope
  // after that.
  void* mine = own_base();
  void* found = base_of(real_dlsym(RTLD_DEFAULT, "dlsym"));
  if (mine == nullptr || found == nullptr) return true;  // cannot tell: behave as before (preloaded)
  return found == mine;
}

void* other_copy_symbol(const char* name) {
  void* sym = real_dlsym(RTLD_DEFAULT, name);
  void* base = base_of(sym);
  if (base == nullptr || base == own_base()) return nullptr;
  return sym;
}

}  // namespace cachalloc::shim
