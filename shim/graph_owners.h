// graph_owners.h — which graphs keep a capture's blocks, and when the last
// one is gone.
//
// A CUDA graph replays the addresses its capture saw.  Blocks the program
// allocated or freed during a capture belong to that capture (PyTorch's
// private pools): the core holds them for an owner *token*
// (core/ledger_owners.cpp) until the shim releases it.  This registry issues
// the tokens and counts what keeps each one alive:
//
//   * the capture itself, while it is in flight;
//   * every graph made from it: the graph end-capture returns (and the
//     graph cuStreamBeginCaptureToGraph captures into), clones
//     (cuGraphClone), parents a child-graph node copied it into
//     (cuGraphAddChildGraphNode, cuGraphAddNode of a graph node);
//   * every executable graph made from such a graph (cuGraphInstantiate*),
//     or updated from one (cuGraphExecUpdate, cuGraphExecChildGraphNode-
//     SetParams: the exec takes the graph's addresses; it keeps its older
//     tokens too, since which nodes the update replaced is not tracked);
//   * union tokens (below) that name it.
//
// When nothing keeps a token, release_owner frees its blocks in every
// context that holds some (behind a fence: the last replay may still run).
//
// A free during a capture belongs to the captures in flight in the block's
// context (all captures in flight when none is in that context: a kernel of
// another device may use it through peer access), and to the token the
// block already has (allocated during an earlier capture whose graph
// lives).  Where that is more than one token, a *union* token is issued that
// each of them keeps alive: the block is held until all of them are gone.
// Wherever tracking is impossible (a graph the program hands to a call not
// listed above) the rule errs on holding longer, never shorter.
//
// Invariants (check_graph_owners, validate()): a token's count equals the
// captures, graph and exec entries naming it, plus the union tokens it
// keeps, plus pins (calls in progress); a token with count 0 is gone;
// no entry names a token that is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_api.h"

namespace cachalloc::shim {

// A capture begins: a new token, kept alive by the capture.
std::uint64_t open_capture_token();
// The capture ended; `graph` is the graph it produced or captured into
// (nullptr: none, the capture failed).  Drops the capture's count.
void close_capture_token(std::uint64_t token, CUgraph graph, CUgraph into);

// The token a block allocated or freed now in `ctx` belongs to: the
// captures in flight `captures` (capture_tracking.cpp's choice) and the
// block's current owner `owner` (0: none), one token or their union.
// Pinned (kept alive) until unpin_token; `ctx` is noted as holding blocks
// for it.  0 when `captures` is empty and `owner` is gone.
std::uint64_t pin_token(CUcontext ctx, const std::vector<std::uint64_t>& captures, std::uint64_t owner);
void unpin_token(std::uint64_t token);

// After the driver's call succeeded.
void graph_cloned(CUgraph original, CUgraph clone);
void graph_embedded(CUgraph parent, CUgraph child);  // a child-graph node of `child` added to `parent`
void graph_instantiated(CUgraphExec exec, CUgraph graph);
void exec_updated(CUgraphExec exec, CUgraph graph);   // the exec now replays (part of) `graph`
// Before the driver's destroy (the handle may be reused right after it).
void graph_destroyed(CUgraph graph);
void exec_destroyed(CUgraphExec exec);

// For tests and the dump: tokens alive, graphs and execs holding any.
struct GraphOwnerCounts {
  std::size_t tokens = 0, graphs = 0, execs = 0;
};
GraphOwnerCounts graph_owner_counts();
// The invariants above (cachalloc_validate): the first one broken, or
// nullptr.
const char* check_graph_owners();

}  // namespace cachalloc::shim
