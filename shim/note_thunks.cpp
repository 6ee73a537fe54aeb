// note_thunks.cpp — the thunks of note_thunks.h: a fixed pool of stubs in
// .text, each jumping through its own slot of a target table.
//
// Stub i (32 bytes apart):   endbr64; lea slot_i(%rip), %r11; jmp common
// common:                    save rdi rsi rdx rcx r8 r9 rax r11, xmm0-7;
//                            call cachalloc_thunk_note (C++, noexcept:
//                            the ThunkNote given to note_thunk_for);
//                            restore; jmp *(%r11)
// r11 is the one integer register the SysV ABI lets a call clobber before
// the callee runs (neither an argument nor callee-saved); rax carries the
// vector-register count of variadic calls, so it is kept too.  The stack is
// as the caller left it when the jump is taken, so stack arguments and the
// return address are the callee's.
#include "note_thunks.h"

#include <atomic>
#include <mutex>

#include "log.h"

namespace {

constexpr int kThunks = 512;
std::atomic<unsigned long> g_calls{0};
std::atomic<cachalloc::shim::ThunkNote> g_note{nullptr};  // set before any thunk is handed out

}  // namespace

// Read by the stubs (hidden: a PC-relative load, no GOT).
extern "C" {
__attribute__((visibility("hidden"))) void* cachalloc_thunk_targets[kThunks];
}

// Called from the common stub with every argument register saved: it may
// clobber any caller-saved register.
extern "C" __attribute__((visibility("hidden"), used)) void cachalloc_thunk_note() noexcept {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (const cachalloc::shim::ThunkNote note = g_note.load(std::memory_order_acquire)) note();
}

#if defined(__x86_64__)
extern "C" __attribute__((visibility("hidden"))) char cachalloc_thunk_stubs[];

// 8 pushes (64 bytes) leave the stack 8 mod 16 as at entry; 136 more bytes
// (128 for xmm0-7, 8 of padding) align it for the call.
asm(R"(
    .text
    .p2align 5
    .globl cachalloc_thunk_stubs
    .hidden cachalloc_thunk_stubs
    .type cachalloc_thunk_stubs, @function
cachalloc_thunk_stubs:
    .set cachalloc_thunk_i, 0
    .rept 512
    .p2align 5
    endbr64
    leaq cachalloc_thunk_targets+8*cachalloc_thunk_i(%rip), %r11
    jmp cachalloc_thunk_common
    .set cachalloc_thunk_i, cachalloc_thunk_i+1
    .endr
    .p2align 5
cachalloc_thunk_common:
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    pushq %r11
    subq $136, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    call cachalloc_thunk_note
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    addq $136, %rsp
    popq %r11
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    jmp *(%r11)
    .size cachalloc_thunk_stubs, .-cachalloc_thunk_stubs
)");
#endif

namespace cachalloc::shim {
namespace {

std::mutex& thunks_mutex() {
  static auto* m = new std::mutex();  // never destroyed: lookups may come at exit
  return *m;
}
int g_used = 0;  // guarded by thunks_mutex

}  // namespace

void* note_thunk_for(void* target, ThunkNote note) noexcept {
#if defined(__x86_64__)
  if (target == nullptr) return nullptr;
  g_note.store(note, std::memory_order_release);
  try {
    std::lock_guard lock(thunks_mutex());
    for (int i = 0; i < g_used; ++i)
      if (__atomic_load_n(&cachalloc_thunk_targets[i], __ATOMIC_RELAXED) == target)
        return cachalloc_thunk_stubs + 32 * i;
    if (g_used == kThunks) {
      static bool warned = false;
      if (!warned)
        obs::logger().warn("all {} thunks for unknown driver entry points are in use: later ones are handed out "
                           "unwatched (set free_sync:fence if the program uses per-thread default streams)",
                           kThunks);
      warned = true;
      return nullptr;
    }
    // Published before the stub's address leaves this function.
    __atomic_store_n(&cachalloc_thunk_targets[g_used], target, __ATOMIC_RELEASE);
    return cachalloc_thunk_stubs + 32 * g_used++;
  } catch (...) {
    return nullptr;
  }
#else
  (void)target;
  (void)note;
  return nullptr;
#endif
}

int note_thunks_used() noexcept {
  std::lock_guard lock(thunks_mutex());
  return g_used;
}

unsigned long note_thunk_calls() noexcept { return g_calls.load(std::memory_order_relaxed); }

}  // namespace cachalloc::shim
