/* fake_graphs.c — graphs, executable graphs, and what a capture forbids.
 *
 * Graphs are handles only: nothing is replayed.  Every graph and exec is
 * its own object (never freed: a destroyed one is recognized), so that the
 * shim's registry of which graph keeps which blocks (shim/graph_owners.h)
 * is exercised with distinct handles: end-capture, clone, instantiate
 * (every ABI), child-graph nodes, exec update, destroy.
 *
 * A capture forbids "potentially unsafe" calls (cuMemAlloc, cuMemFree) the
 * driver's way: in a thread whose capture mode (cuThreadExchangeStream-
 * CaptureMode, global by default) is global, while any thread runs a
 * global-mode capture or this thread a thread-local one; in a thread-local
 * mode thread, only its own non-relaxed captures; in a relaxed one, never.
 * The forbidden call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates the captures that forbade it. */
#include <stdlib.h>

#include "fake_state.h"

#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphAddNode

static __thread int thread_mode_set;
static __thread CUstreamCaptureMode thread_mode;

static CUstreamCaptureMode current_thread_mode(void) {
  return thread_mode_set ? thread_mode : CU_STREAM_CAPTURE_MODE_GLOBAL;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = current_thread_mode();
  thread_mode = *mode;
  thread_mode_set = 1;
  *mode = old;
  return CUDA_SUCCESS;
}

/* Whether capture `st` forbids this thread's unsafe calls (lock held). */
static int forbids(const struct CUstream_st* st, CUstreamCaptureMode tm) {
  if (!st->capturing || tm == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
  const int own = pthread_equal(st->capture_thread, pthread_self());
  if (own) return st->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  return tm == CU_STREAM_CAPTURE_MODE_GLOBAL && st->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

static int forbid_and_invalidate(struct CUstream_st* st, CUstreamCaptureMode tm) {
  if (!forbids(st, tm)) return 0;
  if (!st->capture_invalidated) {
    st->capture_invalidated = 1;
    fake.stats.capture_invalidations++;
  }
  return 1;
}

int fake_capture_forbids_unsafe_call(void) {
  const CUstreamCaptureMode tm = current_thread_mode();
  int refused = 0;
  for (struct CUstream_st* o = fake.streams; o; o = o->next) refused |= forbid_and_invalidate(o, tm);
  for (struct CUstream_st* o = fake_first_thread_stream(); o; o = o->thread_next) refused |= forbid_and_invalidate(o, tm);
  if (refused) fake.stats.capture_refusals++;
  return refused;
}

/* ---------------- graphs ---------------- */

struct CUgraph_st* fake_new_graph(void) {
  struct CUgraph_st* g = calloc(1, sizeof *g);
  fake.stats.live_graphs++;
  return g;
}

static int graph_ok(CUgraph g) { return g != NULL && !g->dead; }

EXPORT CUresult cuGraphCreate(CUgraph* out, unsigned int flags) {
  if (out == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  *out = fake_new_graph();
  fake_unlock();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphClone(CUgraph* out, CUgraph original) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = graph_ok(original) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *out = fake_new_graph();
  fake_unlock();
  return r;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
  fake_lock();
  CUresult r = graph_ok(g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    g->dead = 1;
    fake.stats.live_graphs--;
  }
  fake_unlock();
  return r;
}

/* Node handles are never looked at: any non-null pointer will do. */
static struct { int unused; } a_node;

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps, size_t n,
                                         CUgraph child) {
  if (node == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = graph_ok(parent) && graph_ok(child) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *node = (CUgraphNode)&a_node;
  fake_unlock();
  return r;
}

static CUresult add_node(CUgraphNode* node, CUgraph parent, CUgraphNodeParams* p) {
  if (node == NULL || p == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = graph_ok(parent) && (p->type != CU_GRAPH_NODE_TYPE_GRAPH || graph_ok(p->graph.graph))
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *node = (CUgraphNode)&a_node;
  fake_unlock();
  return r;
}
EXPORT CUresult cuGraphAddNode(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps, size_t n,
                               CUgraphNodeParams* p) {
  return add_node(node, parent, p);
}
EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps,
                                  const CUgraphEdgeData* data, size_t n, CUgraphNodeParams* p) {
  return add_node(node, parent, p);
}

/* ---------------- executable graphs ---------------- */

static CUresult instantiate(CUgraphExec* out, CUgraph g) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = graph_ok(g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    *out = calloc(1, sizeof **out);
    fake.stats.live_execs++;
  }
  fake_unlock();
  return r;
}
EXPORT CUresult cuGraphInstantiate(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n) {
  return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n) {
  return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph g, unsigned long long flags) {
  return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate(out, g);
}

static CUresult exec_check(CUgraphExec e, CUgraph g) {
  fake_lock();
  CUresult r = e != NULL && !e->dead && graph_ok(g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return r;
}
EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode* err, CUgraphExecUpdateResult* res) {
  if (res) *res = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return exec_check(e, g);
}
EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  if (info) info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return exec_check(e, g);
}
EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode node, CUgraph child) {
  return exec_check(e, child);
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  fake_lock();
  CUresult r = e != NULL && !e->dead ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    e->dead = 1;
    fake.stats.live_execs--;
  }
  fake_unlock();
  return r;
}

/* Launches run nothing (the fake has no kernels). */
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  fake_lock();
  CUresult r = e != NULL && !e->dead ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return r;
}
