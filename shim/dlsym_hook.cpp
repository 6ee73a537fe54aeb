// dlsym_hook.cpp — the exported dlsym.
//
// JAX, numba and cudart's loader look driver functions up with
// dlsym(libcuda_handle, name); LD_PRELOAD symbol resolution never sees
// such lookups, so cachalloc exports dlsym itself.  It must cost next to
// nothing for every other lookup in the process: only names starting with
// "cu" on the libcuda handle are considered, everything else is one
// tail call to glibc's dlsym.
//
// RTLD_NEXT: glibc's dlsym finds "the next object after the caller" from its
// return address.  The common path below is a sibling call (a jump), so
// glibc sees the original caller's return address and RTLD_NEXT keeps its
// meaning; the function is compiled with optimize("O2") so this holds in
// -O0 builds too, and a test (route_rtld_next) checks it.
//
// Recursion: the real dlsym is found with dlvsym, which does not go through
// dlsym.  Should anything still re-enter while it is being resolved (another
// preloaded library hooking malloc, say), the inner call gets nullptr
// rather than recursing forever.
#include <dlfcn.h>

#include <atomic>

#include "hook_table.h"
#include "link_imports.h"
#include "real_driver.h"

namespace cachalloc::shim {
namespace {

// noexcept: a call through it from the noexcept dlsym needs no EH landing
// pad, which is what lets the compiler emit the sibling call.
using DlsymFn = void* (*)(void*, const char*) noexcept;

// A sanitizer runtime (ASan, TSan) looks its interceptors up with dlsym
// while it initializes, which reaches this dlsym before instrumented code
// or the runtime's own interceptors may run: the path to glibc's dlsym is
// built without sanitizer checks (NO_SANITIZE), reads g_real_dlsym with
// __atomic builtins (std::atomic's members would be out-of-line calls to
// instrumented code), and t_resolving is initial-exec TLS, read without a
// call to __tls_get_addr (which the runtimes intercept).
#define NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
DlsymFn g_real_dlsym = nullptr;
std::atomic<void*> g_libcuda{nullptr};
thread_local bool t_resolving __attribute__((tls_model("initial-exec"))) = false;

NO_SANITIZE DlsymFn resolve_real_dlsym() {
  if (t_resolving) return nullptr;
  t_resolving = true;
  auto fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
  if (fn == nullptr) fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
  t_resolving = false;
  if (fn != nullptr) __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
  return fn;
}

NO_SANITIZE inline DlsymFn real_dlsym_fn() {
  DlsymFn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  return fn != nullptr ? fn : resolve_real_dlsym();
}

bool is_libcuda(void* handle) {
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) return false;
  void* h = g_libcuda.load(std::memory_order_acquire);
  if (h == nullptr) h = loaded_libcuda_handle();
  return h != nullptr && h == handle;
}

// A "cu" name on the libcuda handle: the wrapper if cachalloc has one and
// the driver has the symbol, else the driver's answer.
void* lookup_cuda_symbol(DlsymFn real, void* handle, const char* name) {
  void* sym = real(handle, name);
  if (sym == nullptr) return nullptr;
  check_link_imports();  // a lookup often follows a load (link_imports.h)
  void* wrapper = wrapper_for_symbol(name, sym);
  return wrapper != nullptr ? wrapper : sym;
}

}  // namespace

void* real_dlsym(void* handle, const char* name) {
  DlsymFn fn = real_dlsym_fn();
  return fn != nullptr ? fn(handle, name) : nullptr;
}

// RTLD_NOLOAD never loads: a process without CUDA stays without it.  The
// handle is kept once found (the extra reference is harmless: libcuda is
// never unloaded by the programs this serves).
void* loaded_libcuda_handle() {
  void* h = g_libcuda.load(std::memory_order_acquire);
  if (h != nullptr) return h;
  h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (h != nullptr) g_libcuda.store(h, std::memory_order_release);
  return h;
}

}  // namespace cachalloc::shim

// optimize(...): even in a -O0 build the common path must stay a jump.
extern "C" __attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) NO_SANITIZE void* dlsym(
    void* __restrict handle, const char* __restrict name) noexcept {
  using namespace cachalloc::shim;
  DlsymFn real = real_dlsym_fn();
  if (real == nullptr) [[unlikely]] return nullptr;
  // glibc declares name nonnull; a NULL name is undefined there as here.
  if (name[0] == 'c' && name[1] == 'u' && is_libcuda(handle)) [[unlikely]]
    return lookup_cuda_symbol(real, handle, name);
  return real(handle, name);  // sibling call: keeps the caller's return address for RTLD_NEXT
}
