// ledger_owners.cpp — blocks held for an owner token (a graph capture's):
// the ledger's owner entries (ledger.h).
//
// A CUDA graph keeps using the addresses its capture saw at every replay,
// so a block the program frees during a capture, or allocates during one
// and frees later, must not be handed to anyone else while a graph or an
// executable graph made from that capture lives (PyTorch keeps such blocks
// in the capture's private pool).  The core knows no graphs: the shim
// issues one token per set of captures in flight (shim/graph_owners.h) and
// releases it when the last graph derived from them is destroyed.
//
// A held block stays allocated for the core: the live map, the statistics
// (capture_held_bytes besides) and pause/resume treat it as live, so its
// pages come back at the same addresses after a resume, as the graph
// expects.  For the program it is freed: is_live and query say so, and a
// second free is kInvalidValue.  Release frees the blocks behind a fence:
// the graph's last launch, on whichever stream, may still run.  The
// allocator's entry points (caching_allocator.cpp: open_owner, hold_for,
// mark_owner, release_owner, owner_of) look the blocks up and call here.
#include "caching_allocator.h"

namespace cachalloc {

bool Ledger::hold_for_owner(Block* block) {
  auto it = owners_.find(block->owner);
  if (it == owners_.end()) {
    block->owner = 0;
    return false;
  }
  set_phase(*block, BlockPhase::owner_held);
  it->second.push_back(block);
  stats_.capture_held_bytes.increase(static_cast<std::int64_t>(block->size));
  return true;
}

std::vector<Block*> Ledger::release_owner(std::uint64_t token, std::size_t* bytes) {
  *bytes = 0;
  auto it = owners_.find(token);
  if (it == owners_.end()) return {};
  std::vector<Block*> held = std::move(it->second);
  owners_.erase(it);
  for (Block* b : held) {
    set_phase(*b, BlockPhase::allocated);
    b->owner = 0;
    stats_.capture_held_bytes.decrease(static_cast<std::int64_t>(b->size));
    *bytes += b->size;
  }
  return held;
}

}  // namespace cachalloc
