// block_phase.cpp — names of block phases (block.h), and the debug build's
// report of a phase change that block.h's table does not allow.
#include <cstdio>
#include <cstdlib>

#include "block.h"

namespace cachalloc {

const char* block_phase_name(BlockPhase p) {
  switch (p) {
    case BlockPhase::spare: return "spare";
    case BlockPhase::detached: return "detached";
    case BlockPhase::free: return "free";
    case BlockPhase::held: return "held";
    case BlockPhase::allocated: return "allocated";
    case BlockPhase::owner_held: return "owner_held";
    case BlockPhase::tc_out: return "tc_out";
    case BlockPhase::tc_cached: return "tc_cached";
    case BlockPhase::tc_waiting: return "tc_waiting";
    case BlockPhase::pending: return "pending";
    case BlockPhase::deferred: return "deferred";
    case BlockPhase::retained: return "retained";
    case BlockPhase::unmapped: return "unmapped";
  }
  return "invalid";
}

#if CACHALLOC_DEBUG
// Aborts, as CACHALLOC_ASSERT does: the caller may be an extern "C" entry
// point of the shim, where nothing may throw.
void phase_change_failed(const Block& b, BlockPhase to, const std::source_location& at) {
  std::fprintf(stderr,
               "cachalloc: assertion failed: block phase change %s -> %s is not in block.h's table "
               "(block 0x%llx size %zu) at %s:%u (%s)\n",
               block_phase_name(b.phase()), block_phase_name(to), static_cast<unsigned long long>(b.ptr), b.size,
               at.file_name(), static_cast<unsigned>(at.line()), at.function_name());
  std::abort();
}
#endif

}  // namespace cachalloc
