// exit_hooks.cpp — writing cachalloc's reports exactly once when the process
// ends, and the snapshot on the user's signal (see exit_hooks.h).
//
// Ways a process ends and what happens:
//  * exit() / return from main: the atexit handler writes the reports.  It is
//    registered when CUDA is first used, so it runs before the destructors of
//    statics constructed earlier (atexit runs in reverse order).
//  * SIGTERM / SIGINT with the default disposition: our handler writes the
//    reports, restores SIG_DFL, unblocks and re-raises the signal, so the
//    process dies of the same signal (same exit status for the parent).
//  * SIGTERM / SIGINT with a program handler (Python's SIGINT handler, say):
//    we only chain to it; the program decides how it ends, and if it ends
//    through exit() the atexit handler writes the reports.  A program whose
//    handler calls _exit() gets no reports.
//  * SIGTERM / SIGINT ignored (SIG_IGN, e.g. a background job's SIGINT): we
//    install nothing, so the signal stays ignored.
//  * _exit(), abort(), SIGKILL: no reports.
//  * fork(): the child never writes the parent's reports (it cannot use
//    CUDA, and it would overwrite the parent's files).
//
// Nested report signals: while one report handler collects or writes (or
// the atexit handler does), the other report signals (SIGTERM, SIGINT, the
// snapshot signal) are blocked in that thread: every handler is installed
// with all of them in its sa_mask, and cachalloc_write_exit_reports_once
// blocks them around collecting.  Without that, a SIGTERM arriving while
// the snapshot handler collects the state ran the exit reports inside it,
// collecting again: the allocator's lock taken twice by one thread (a
// deadlock) or malloc re-entered (heap corruption).  The blocked signal is
// delivered once the report is done.  tests/hostile/signals_during_dump.py
// --nested (hostile_signals_nested) proves it.  When we chain to the
// program's own handler, it runs with the mask it would have had without
// cachalloc (its sa_mask, not ours).
//
// Signal-safety risk (documented in docs/OBSERVABILITY.md): writing files in
// a signal handler is not async-signal-safe.  collect_report takes the
// allocators' locks and the writers allocate host memory; if the signal
// interrupts a thread that holds an allocator lock or the malloc lock, the
// handler can deadlock.  We accept this for SIGTERM/SIGINT/snapshot_signal
// because the alternative (a helper thread woken through a pipe) has its own
// failure modes at exit, and a kill is usually delivered while the program
// is not inside cachalloc.
#include "exit_hooks.h"

#include <pthread.h>
#include <signal.h>
#include <ucontext.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "obs/atomic_file.h"
#include "obs/reports.h"

namespace {

std::atomic<bool> g_installed{false};
std::atomic<bool> g_written{false};
std::atomic<bool> g_disabled{false};  // set in fork children
bool g_want_segments = false;         // config.snapshot != ""
std::atomic<int> g_snapshot_signal{0};  // set before its handler is installed
// What the reports are collected from (exit_hooks.h): set by the first
// install, before any handler or atexit function that reads it.
std::atomic<cachalloc::ReportSource> g_source{nullptr};

// SIGTERM, SIGINT and the snapshot signal (when configured): the signals
// whose handlers collect the state and write reports.
sigset_t report_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int snapshot = g_snapshot_signal.load();
  if (snapshot > 0) sigaddset(&set, snapshot);
  return set;
}

struct SavedHandler {
  int signal = 0;
  struct sigaction previous {};
  bool installed = false;
};
SavedHandler g_term, g_int, g_snapshot;

SavedHandler* saved_for(int sig) {
  if (sig == SIGTERM && g_term.installed) return &g_term;
  if (sig == SIGINT && g_int.installed) return &g_int;
  if (g_snapshot.installed && sig == g_snapshot.signal) return &g_snapshot;
  return nullptr;
}

bool is_program_handler(const struct sigaction& sa) {
  if (sa.sa_flags & SA_SIGINFO) return sa.sa_sigaction != nullptr;
  return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

// Calls the program's own handler as the kernel would have, with the mask
// the kernel would have given it: the interrupted code's mask plus the
// handler's sa_mask (and the signal itself unless SA_NODEFER), not the
// report signals that ours blocks.  The kernel restores the interrupted
// mask when our handler returns.
void chain(SavedHandler* saved, int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = saved->previous;
  if (prev.sa_flags & SA_RESETHAND) {  // one-shot handler: the next signal gets the default
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
  }
  if (context != nullptr) {
    sigset_t mask = static_cast<const ucontext_t*>(context)->uc_sigmask;
    for (int s = 1; s < NSIG; ++s)
      if (sigismember(&prev.sa_mask, s) == 1) sigaddset(&mask, s);
    if (!(prev.sa_flags & SA_NODEFER)) sigaddset(&mask, sig);
    pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  }
  if (prev.sa_flags & SA_SIGINFO)
    prev.sa_sigaction(sig, info, context);
  else
    prev.sa_handler(sig);
}

// Restores the previous (default) disposition and delivers the signal again,
// so the process ends exactly as it would have without cachalloc.
void reraise_default(SavedHandler* saved, int sig) {
  sigaction(sig, &saved->previous, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  raise(sig);                               // pending while blocked in this handler...
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // ...and delivered here
}

void on_terminating_signal(int sig, siginfo_t* info, void* context) {
  int saved_errno = errno;
  SavedHandler* saved = saved_for(sig);
  if (saved != nullptr && is_program_handler(saved->previous)) {
    chain(saved, sig, info, context);
  } else if (saved != nullptr) {
    cachalloc_write_exit_reports_once();
    reraise_default(saved, sig);
  }
  errno = saved_errno;
}

void on_snapshot_signal(int sig, siginfo_t* info, void* context) {
  int saved_errno = errno;
  if (const cachalloc::ReportSource source = g_source.load(); source != nullptr && !g_disabled.load()) {
    try {
      cachalloc::obs::write_snapshot(source(true));
    } catch (...) {
      cachalloc::obs::warn_stderr("snapshot on signal failed");
    }
  }
  if (is_program_handler(g_snapshot.previous)) chain(&g_snapshot, sig, info, context);
  errno = saved_errno;
}

void at_exit() { cachalloc_write_exit_reports_once(); }

void in_fork_child() { g_disabled.store(true); }

// Installs `handler` for `sig`, remembering the previous action.  With
// `respect_ignore`, a signal the program ignores stays ignored.
void install(SavedHandler* saved, int sig, void (*handler)(int, siginfo_t*, void*), bool respect_ignore) {
  struct sigaction previous {};
  if (sigaction(sig, nullptr, &previous) != 0) return;
  if (respect_ignore && !(previous.sa_flags & SA_SIGINFO) && previous.sa_handler == SIG_IGN) return;
  saved->signal = sig;
  saved->previous = previous;
  saved->installed = true;  // before the handler can run
  struct sigaction sa {};
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sa.sa_mask = report_signals();  // no report handler runs inside another (see the top)
  if (sigaction(sig, &sa, nullptr) != 0) saved->installed = false;
}

}  // namespace

bool cachalloc_write_exit_reports_once() {
  const cachalloc::ReportSource source = g_source.load();
  if (g_disabled.load() || source == nullptr) return false;
  // The report signals wait while the state is collected and the reports
  // written (from a handler they are blocked already; from atexit not): a
  // snapshot signal now would collect inside this collection, a SIGTERM
  // would find the reports taken and end the process before they exist.
  // Blocked before the once-only guard, so that a signal between the two
  // cannot end the process with no report written.
  const sigset_t held = report_signals();
  sigset_t previous;
  const bool blocked = pthread_sigmask(SIG_BLOCK, &held, &previous) == 0;
  const bool first = !g_written.exchange(true);
  if (first) {
    try {
      cachalloc::obs::write_exit_reports(source(g_want_segments));
    } catch (...) {
      cachalloc::obs::warn_stderr("writing the exit reports failed");
    }
  }
  if (blocked) pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return first;
}

void cachalloc_install_exit_hooks(const cachalloc::Config& config, cachalloc::ReportSource source) {
  if (g_installed.exchange(true)) return;
  g_source.store(source);
  bool any_report = !config.stats.empty() || !config.snapshot.empty() || !config.trace.empty();
  g_want_segments = !config.snapshot.empty();
  // Known before any handler is installed: each one's sa_mask holds it.
  if (config.snapshot_signal > 0 && !config.snapshot.empty()) g_snapshot_signal.store(config.snapshot_signal);
  pthread_atfork(nullptr, nullptr, in_fork_child);
  if (any_report) {
    std::atexit(at_exit);
    install(&g_term, SIGTERM, on_terminating_signal, true);
    install(&g_int, SIGINT, on_terminating_signal, true);
  }
  // A snapshot signal that is also SIGTERM/SIGINT would lose the chain: refuse.
  bool clashes = (config.snapshot_signal == SIGTERM && g_term.installed) ||
                 (config.snapshot_signal == SIGINT && g_int.installed);
  if (clashes) cachalloc::obs::warn_stderr("snapshot_signal is SIGTERM/SIGINT; snapshots come with the exit reports");
  if (config.snapshot_signal > 0 && !config.snapshot.empty() && !clashes)
    install(&g_snapshot, config.snapshot_signal, on_snapshot_signal, false);
}
