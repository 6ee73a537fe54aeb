// graph_entry_points.cpp — the graph calls that make, copy, update and
// destroy graphs and executable graphs: each reports to the registry of
// owner tokens (graph_owners.h) after the driver's call succeeded (a
// destroy: before it, while the handle is still the program's).
#include "graph_entry_points.h"

#include "graph_owners.h"
#include "guarded.h"
#include "real_driver.h"
#include "stream_watch.h"

using namespace cachalloc::shim;

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

const RealDriver* drv() { return real_driver(); }

#define REAL_OR_FAIL(fn)                                                      \
  [[maybe_unused]] const auto real_fn = drv() ? drv()->fn : nullptr;          \
  if (real_fn == nullptr) return CUDA_ERROR_NOT_FOUND

CUresult instantiated(CUresult r, CUgraphExec* exec, CUgraph graph) {
  if (r == CUDA_SUCCESS && exec != nullptr) graph_instantiated(*exec, graph);
  return r;
}

// cuGraphInstantiateWithParams may upload on hUploadStream: the per-thread
// stream is noted as the generated wrappers note it (stream_watch.h).
void note_upload_stream(const CUDA_GRAPH_INSTANTIATE_PARAMS* p, bool ptsz) {
  if (ptsz) {
    note_per_thread_stream();  // a _ptsz entry point may use it by definition
    return;
  }
  if (p != nullptr && p->hUploadStream == CU_STREAM_PER_THREAD) note_per_thread_stream();
}

}  // namespace

EXPORT CUresult cachalloc_cuGraphInstantiate_v1(CUgraphExec* e, CUgraph g, CUgraphNode* err, char* log, size_t n) {
  return guarded([&] {
    REAL_OR_FAIL(graph_instantiate_v1);
    return instantiated(real_fn(e, g, err, log, n), e, g);
  });
}

EXPORT CUresult cachalloc_cuGraphInstantiate_v2(CUgraphExec* e, CUgraph g, CUgraphNode* err, char* log, size_t n) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphInstantiate_v2);
    return instantiated(real_fn(e, g, err, log, n), e, g);
  });
}

EXPORT CUresult cachalloc_cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long flags) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphInstantiateWithFlags);
    return instantiated(real_fn(e, g, flags), e, g);
  });
}

EXPORT CUresult cachalloc_cuGraphInstantiateWithParams(CUgraphExec* e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphInstantiateWithParams);
    note_upload_stream(p, false);
    return instantiated(real_fn(e, g, p), e, g);
  });
}

EXPORT CUresult cachalloc_cuGraphInstantiateWithParams_ptsz(CUgraphExec* e, CUgraph g,
                                                            CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphInstantiateWithParams_ptsz);
    note_upload_stream(p, true);
    return instantiated(real_fn(e, g, p), e, g);
  });
}

EXPORT CUresult cachalloc_cuGraphClone(CUgraph* clone, CUgraph original) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphClone);
    const CUresult r = real_fn(clone, original);
    if (r == CUDA_SUCCESS && clone != nullptr) graph_cloned(original, *clone);
    return r;
  });
}

// The child graph is copied into the parent: the parent replays its addresses.
EXPORT CUresult cachalloc_cuGraphAddChildGraphNode(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps,
                                                   size_t ndeps, CUgraph child) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphAddChildGraphNode);
    const CUresult r = real_fn(node, parent, deps, ndeps, child);
    if (r == CUDA_SUCCESS) graph_embedded(parent, child);
    return r;
  });
}

namespace {
void added_node(CUresult r, CUgraph parent, const CUgraphNodeParams* p) {
  if (r == CUDA_SUCCESS && p != nullptr && p->type == CU_GRAPH_NODE_TYPE_GRAPH) graph_embedded(parent, p->graph.graph);
}
}  // namespace

EXPORT CUresult cachalloc_cuGraphAddNode_v1(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps, size_t ndeps,
                                            CUgraphNodeParams* p) {
  return guarded([&] {
    REAL_OR_FAIL(graph_add_node_v1);
    const CUresult r = real_fn(node, parent, deps, ndeps, p);
    added_node(r, parent, p);
    return r;
  });
}

EXPORT CUresult cachalloc_cuGraphAddNode_v2(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps,
                                            const CUgraphEdgeData* data, size_t ndeps, CUgraphNodeParams* p) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphAddNode_v2);
    const CUresult r = real_fn(node, parent, deps, data, ndeps, p);
    added_node(r, parent, p);
    return r;
  });
}

// An update makes the exec replay the graph's addresses.  Whether it
// succeeded or not, the exec keeps its older tokens (which nodes changed is
// not tracked); a failed update may have changed some nodes, so the graph's
// tokens are taken in every case (holding longer, never shorter).
EXPORT CUresult cachalloc_cuGraphExecUpdate_v1(CUgraphExec e, CUgraph g, CUgraphNode* err,
                                               CUgraphExecUpdateResult* res) {
  return guarded([&] {
    REAL_OR_FAIL(graph_exec_update_v1);
    const CUresult r = real_fn(e, g, err, res);
    exec_updated(e, g);
    return r;
  });
}

EXPORT CUresult cachalloc_cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphExecUpdate_v2);
    const CUresult r = real_fn(e, g, info);
    exec_updated(e, g);
    return r;
  });
}

EXPORT CUresult cachalloc_cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode node, CUgraph child) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphExecChildGraphNodeSetParams);
    const CUresult r = real_fn(e, node, child);
    exec_updated(e, child);
    return r;
  });
}

EXPORT CUresult cachalloc_cuGraphDestroy(CUgraph g) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphDestroy);
    // Before the real destroy: once it returns the handle may name a new
    // graph.  A destroy the driver refuses (an invalid handle) named no
    // graph the registry knows.
    graph_destroyed(g);
    return real_fn(g);
  });
}

EXPORT CUresult cachalloc_cuGraphExecDestroy(CUgraphExec e) {
  return guarded([&] {
    REAL_OR_FAIL(cuGraphExecDestroy);
    exec_destroyed(e);
    return real_fn(e);
  });
}
