// link_imports.h — driver names a program bound at link time that no hook
// sees.
//
// A program linked against libcuda (-lcuda, no cudart, no dlsym) binds its
// driver calls when it is loaded: the preloaded library answers only the
// names it exports, and those come from the toolkit headers it was built
// with.  A name newer than those headers (a newer driver's _ptsz entry
// point, a new ABI of a launch) is bound straight to libcuda: work it puts
// on a thread's per-thread stream is never noted (stream_watch.h), so
// free_sync:auto could reuse a plain free at once beside it.
//
// So the imports of every loaded object are read (its PLT and GLOB_DAT
// relocations: the names the dynamic linker binds, not the ones the program
// happens to call) at start-up and again whenever objects were loaded since
// the last look, when a context gets its cache.  A driver name that
// cachalloc neither exports nor knows to name no stream makes every
// context leave the single sequence: plain frees wait for fences (memory,
// never correctness), and a warning names the imports.  Objects loaded
// between two looks can only meet blocks freed after the later one is
// taken, which is when they first reach a context's cache or later; the
// serial-end event orders their streams after earlier work (stream_order.h).
#pragma once

#include <string>
#include <vector>

namespace cachalloc::shim {

// Looks at the objects loaded since the last look (cheap when none: one
// pass of dl_iterate_phdr that stops at the first object): new unseen
// imports are warned about and every live context leaves the single
// sequence.  Only while the hooks serve.  Never throws.
void check_link_imports() noexcept;
// The same during initialization, before the mode is set.
void check_link_imports_at_start() noexcept;

// True once any loaded object imports a driver name no hook sees: contexts
// created from then on start outside the single sequence.
bool unseen_link_imports() noexcept;

// A stream no context's hooks see the work of was created (a green
// context's: address_ops.h): contexts created from then on start outside
// the single sequence too.
void note_streams_outside_contexts() noexcept;

// The unseen imports found so far, for tests and the dump.
std::vector<std::string> unseen_link_import_names();

}  // namespace cachalloc::shim
