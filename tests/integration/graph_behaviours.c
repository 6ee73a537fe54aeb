/* graph_behaviours.c — blocks a graph capture allocated or freed stay the
 * capture's until every graph and executable graph made from it is gone
 * (shim/graph_owners.h, shim/capture_owned.h), on each route.
 *
 * A graph replays the addresses its capture saw.  Before the registry, a
 * block freed during a capture was reusable at once after it (in a serial
 * context, at once even during it): the next allocation got its address
 * and a replay wrote over it (issue 34 item 2, seen on an H200 as an
 * illegal memory access at the second replay).  Each behaviour here handed
 * that address out on ca0351e.  The fake driver replays nothing: a
 * behaviour checks which addresses allocations get, and that the driver's
 * refusals during strict captures are reproduced. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "route_common.h"

#define MiB ((size_t)1 << 20)
enum { kTries = 64 }; /* allocations that must not (or must) meet the address */

typedef CUresult (*graph_destroy_fn)(CUgraph);
typedef CUresult (*exec_destroy_fn)(CUgraphExec);
typedef CUresult (*instantiate_fn)(CUgraphExec*, CUgraph, unsigned long long);
typedef CUresult (*instantiate_v1_fn)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
typedef CUresult (*clone_fn)(CUgraph*, CUgraph);
typedef CUresult (*create_fn)(CUgraph*, unsigned int);
typedef CUresult (*child_fn)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph);
typedef CUresult (*add_node_fn)(CUgraphNode*, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                CUgraphNodeParams*);
typedef CUresult (*exec_update_fn)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*);
typedef CUresult (*exchange_fn)(CUstreamCaptureMode*);

static graph_destroy_fn graph_destroy;
static exec_destroy_fn exec_destroy;
static instantiate_fn instantiate;
static instantiate_v1_fn instantiate_v1;
static clone_fn clone_graph;
static create_fn create_graph;
static child_fn add_child;
static add_node_fn add_node;
static exec_update_fn exec_update;
static exchange_fn exchange_mode;

static int load(void) {
  graph_destroy = (graph_destroy_fn)A->entry("cuGraphDestroy", 10000, 0, "cuGraphDestroy");
  exec_destroy = (exec_destroy_fn)A->entry("cuGraphExecDestroy", 10000, 0, "cuGraphExecDestroy");
  instantiate = (instantiate_fn)A->entry("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags");
  instantiate_v1 = (instantiate_v1_fn)A->entry("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2");
  clone_graph = (clone_fn)A->entry("cuGraphClone", 10000, 0, "cuGraphClone");
  create_graph = (create_fn)A->entry("cuGraphCreate", 10000, 0, "cuGraphCreate");
  add_child = (child_fn)A->entry("cuGraphAddChildGraphNode", 10000, 0, "cuGraphAddChildGraphNode");
  add_node = (add_node_fn)A->entry("cuGraphAddNode", 12030, 0, "cuGraphAddNode_v2");
  exec_update = (exec_update_fn)A->entry("cuGraphExecUpdate", 12000, 0, "cuGraphExecUpdate_v2");
  exchange_mode = (exchange_fn)A->entry("cuThreadExchangeStreamCaptureMode", 10010, 0,
                                        "cuThreadExchangeStreamCaptureMode");
  return graph_destroy && exec_destroy && instantiate && instantiate_v1 && clone_graph && create_graph && add_child &&
         add_node && exec_update && exchange_mode;
}

/* Allocates kTries blocks of `size` (then frees them): 1 when one of them
 * got address p. */
static int meets(CUdeviceptr p, size_t size) {
  CUdeviceptr b[kTries];
  int n = 0, met = 0;
  for (; n < kTries; ++n) {
    if (A->mem_alloc(&b[n], size) != CUDA_SUCCESS) break;
    met |= b[n] == p;
  }
  for (int i = 0; i < n; ++i) A->mem_free(b[i]);
  /* Cached blocks of this size would serve the next call before p could:
   * give whole free segments back (p, held, keeps its own). */
  int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachalloc_empty_cache");
  if (empty_cache != NULL) empty_cache(-1);
  return met;
}

/* capture_held_bytes.current from the dump (cachalloc_stats_json), or -1. */
static long long capture_held_bytes(void) {
  int (*stats_json)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_stats_json");
  static char buf[1 << 20];
  if (stats_json == NULL || stats_json(buf, sizeof buf) != 0) return -1;
  const char* c = strstr(buf, "\"capture_held_bytes.current\"");
  if (c == NULL) return -1;
  c = strchr(c, ':');
  return c == NULL ? -1 : strtoll(c + 1, NULL, 10);
}

/* The registry and the core agree with themselves (cachalloc_validate). */
static int valid(void) {
  int (*validate)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_validate");
  char msg[256] = "";
  if (validate == NULL) return 0;
  if (validate(msg, sizeof msg) != 0) {
    fprintf(stderr, "[%s] validate: %s\n", g_route, msg);
    return 0;
  }
  return 1;
}

/* How the block leaves the program during the capture. */
enum how { PLAIN_FREE, OTHER_STREAM_FREE, ALLOCATED_IN_CAPTURE };
/* What is made of the captured graph, and the order things go. */
enum life { EXEC_AFTER_GRAPH, GRAPH_AFTER_EXEC, CLONE, CHILD, CHILD_NODE, EXEC_UPDATE, INSTANTIATE_V2 };

static int held_until_gone(enum how how, enum life life) {
  CHECK(load());
  CUstream s, other;
  CUgraph g, g2 = NULL;
  CUgraphExec e = NULL;
  CUdeviceptr p = 0;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->stream_create(&other, 0));
  if (how != ALLOCATED_IN_CAPTURE) CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  if (how == ALLOCATED_IN_CAPTURE) CHECK_CU(A->mem_alloc(&p, MiB));
  if (how == PLAIN_FREE) CHECK_CU(A->mem_free(p));
  if (how == OTHER_STREAM_FREE) CHECK_CU(A->mem_free_async(p, other));
  CHECK(!meets(p, MiB)); /* not even during the capture */
  CHECK_CU(A->end_capture(s, &g));
  if (how == ALLOCATED_IN_CAPTURE) CHECK_CU(A->mem_free(p)); /* freed after: the graph still replays it */
  CHECK(!meets(p, MiB)); /* the graph lives: its addresses are not anyone else's */
  CHECK(capture_held_bytes() >= (long long)MiB);
  CHECK(valid());
  /* What keeps it, and the handles whose destruction must not free it. */
  /* Destroyed first; then the exec, clone or parent (for GRAPH_AFTER_EXEC
   * the exec went first, and the graph is the last). */
  CUgraph first = life == GRAPH_AFTER_EXEC ? NULL : g;
  switch (life) {
    case EXEC_AFTER_GRAPH:
      CHECK_CU(instantiate(&e, g, 0));
      break;
    case INSTANTIATE_V2:
      CHECK_CU(instantiate_v1(&e, g, NULL, NULL, 0));
      break;
    case GRAPH_AFTER_EXEC:
      CHECK_CU(instantiate(&e, g, 0));
      CHECK(!meets(p, MiB));
      CHECK_CU(exec_destroy(e)); /* the graph lives on */
      e = NULL;
      CHECK(!meets(p, MiB));
      break;
    case CLONE:
      CHECK_CU(clone_graph(&g2, g));
      break;
    case CHILD:
    case CHILD_NODE: {
      CUgraphNode node;
      CHECK_CU(create_graph(&g2, 0));
      if (life == CHILD) {
        CHECK_CU(add_child(&node, g2, NULL, 0, g));
      } else {
        CUgraphNodeParams params;
        memset(&params, 0, sizeof params);
        params.type = CU_GRAPH_NODE_TYPE_GRAPH;
        params.graph.graph = g;
        CHECK_CU(add_node(&node, g2, NULL, NULL, 0, &params));
      }
      break;
    }
    case EXEC_UPDATE: {
      CUgraph empty;
      CUgraphExecUpdateResultInfo info;
      CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED)); /* an empty graph, and its exec */
      CHECK_CU(A->end_capture(s, &empty));
      CHECK_CU(instantiate(&e, empty, 0));
      CHECK_CU(graph_destroy(empty));
      CHECK_CU(exec_update(e, g, &info)); /* e now replays g's addresses */
      break;
    }
  }
  CHECK(!meets(p, MiB));
  if (first != NULL) {
    CHECK_CU(graph_destroy(first));
    CHECK(!meets(p, MiB)); /* the exec, clone or parent still replays it */
    CHECK(valid());
  } else {
    CHECK_CU(graph_destroy(g));
  }
  if (e != NULL) CHECK_CU(exec_destroy(e));
  if (g2 != NULL) CHECK_CU(graph_destroy(g2));
  /* Gone: reusable again (after a fence over the work before). */
  CHECK(capture_held_bytes() == 0);
  CHECK(meets(p, MiB));
  CHECK(valid());
  CHECK_CU(A->stream_destroy(other));
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

static int graph_plain_free(void) { return held_until_gone(PLAIN_FREE, EXEC_AFTER_GRAPH); }
static int graph_other_stream_free(void) { return held_until_gone(OTHER_STREAM_FREE, EXEC_AFTER_GRAPH); }
static int graph_allocated_in_capture(void) { return held_until_gone(ALLOCATED_IN_CAPTURE, EXEC_AFTER_GRAPH); }
static int graph_destroyed_after_exec(void) { return held_until_gone(PLAIN_FREE, GRAPH_AFTER_EXEC); }
static int graph_clone(void) { return held_until_gone(PLAIN_FREE, CLONE); }
static int graph_child(void) { return held_until_gone(PLAIN_FREE, CHILD); }
static int graph_child_node(void) { return held_until_gone(PLAIN_FREE, CHILD_NODE); }
static int graph_exec_update(void) { return held_until_gone(PLAIN_FREE, EXEC_UPDATE); }
static int graph_instantiate_v2(void) { return held_until_gone(PLAIN_FREE, INSTANTIATE_V2); }

/* A block freed during two captures in flight at once is held until the
 * graphs of both are gone (the union of their tokens). */
static int graph_two_captures(void) {
  CHECK(load());
  CUstream s1, s2;
  CUgraph g1, g2;
  CUdeviceptr p = 0;
  CHECK_CU(A->stream_create(&s1, 0));
  CHECK_CU(A->stream_create(&s2, 0));
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->begin_capture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(A->begin_capture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->end_capture(s1, &g1));
  CHECK_CU(A->end_capture(s2, &g2));
  CHECK(!meets(p, MiB));
  CHECK_CU(graph_destroy(g2));
  CHECK(!meets(p, MiB));
  CHECK(valid());
  CHECK_CU(graph_destroy(g1));
  CHECK(meets(p, MiB));
  CHECK(valid());
  CHECK_CU(A->stream_destroy(s1));
  CHECK_CU(A->stream_destroy(s2));
  return 0;
}

/* An invalidated capture made no graph: what it freed is reusable after it.
 * (The thread runs a global-mode capture in relaxed mode, frees, then in
 * global mode makes a call the capture forbids.) */
static int graph_capture_invalidated(void) {
  CHECK(load());
  CUstream s;
  CUgraph g;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->mem_alloc(&p, MiB));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK_CU(exchange_mode(&mode));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(A->mem_free(p));
  CHECK(!meets(p, MiB));
  CHECK_CU(exchange_mode(&mode)); /* global again */
  CHECK(A->mem_alloc(&q, MiB) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(A->end_capture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(meets(p, MiB));
  CHECK(valid());
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* ---------------- what a strict capture forbids ---------------- */

struct local_capture {
  CUstream s;
  pthread_barrier_t begun, done;
  CUresult begin, end;
};

static void* capture_thread_local(void* arg) {
  struct local_capture* c = arg;
  c->begin = A->begin_capture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  pthread_barrier_wait(&c->begun);
  pthread_barrier_wait(&c->done);
  CUgraph g;
  c->end = A->end_capture(c->s, &g);
  if (c->end == CUDA_SUCCESS) graph_destroy(g);
  return NULL;
}

/* During a global-mode capture a bare cuMemFree is refused as the driver
 * refuses it (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture
 * invalidated) and the block stays the program's; so is cuMemAlloc.
 * Relaxed mode, a thread-local capture of another thread, and a thread
 * that exchanged its mode for relaxed are allowed. */
static int capture_refuses_bare_calls(void) {
  CHECK(load());
  CUstream s;
  CUgraph g;
  CUdeviceptr p = 0, q = 0;
  unsigned char back[16];
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  const unsigned long inval = stats().capture_invalidations;
  CHECK(A->mem_free(p) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(stats().capture_invalidations == inval + 1);
  CHECK(A->mem_alloc(&q, MiB) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(A->end_capture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* p is still allocated and usable, and nobody else gets it */
  CHECK_CU(A->memset_d8(p, 0x5a, MiB));
  CHECK(!meets(p, MiB));
  CHECK_CU(A->memcpy_dtoh(back, p + MiB - sizeof back, sizeof back));
  for (size_t i = 0; i < sizeof back; ++i) CHECK(back[i] == 0x5a);
  CHECK(valid());
  /* relaxed: allowed, and held for the graph */
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK_CU(A->mem_free(q));
  CHECK_CU(A->end_capture(s, &g));
  CHECK_CU(graph_destroy(g));
  /* another thread's thread-local capture forbids nothing here */
  struct local_capture c = {.s = s};
  pthread_t t;
  pthread_barrier_init(&c.begun, NULL, 2);
  pthread_barrier_init(&c.done, NULL, 2);
  CHECK(pthread_create(&t, NULL, capture_thread_local, &c) == 0);
  pthread_barrier_wait(&c.begun);
  const CUresult freed = A->mem_free(p);
  const CUresult allocated = A->mem_alloc(&q, MiB);
  pthread_barrier_wait(&c.done);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(c.begin == CUDA_SUCCESS && c.end == CUDA_SUCCESS);
  CHECK(freed == CUDA_SUCCESS && allocated == CUDA_SUCCESS);
  CHECK_CU(A->mem_free(q));
  /* this thread exchanged its mode for relaxed: its own global capture
   * forbids it nothing */
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK_CU(exchange_mode(&mode));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK_CU(A->mem_free(q));
  CHECK_CU(A->end_capture(s, &g));
  CHECK_CU(exchange_mode(&mode));
  CHECK_CU(graph_destroy(g));
  CHECK(valid());
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

static const struct {
  const char* name;
  behaviour_fn run;
} behaviours[] = {
    {"graph_plain_free", graph_plain_free},
    {"graph_other_stream_free", graph_other_stream_free},
    {"graph_allocated_in_capture", graph_allocated_in_capture},
    {"graph_destroyed_after_exec", graph_destroyed_after_exec},
    {"graph_clone", graph_clone},
    {"graph_child", graph_child},
    {"graph_child_node", graph_child_node},
    {"graph_exec_update", graph_exec_update},
    {"graph_instantiate_v2", graph_instantiate_v2},
    {"graph_two_captures", graph_two_captures},
    {"graph_capture_invalidated", graph_capture_invalidated},
    {"capture_refuses_bare_calls", capture_refuses_bare_calls},
};

behaviour_fn graph_behaviour(const char* name) {
  for (size_t i = 0; i < sizeof behaviours / sizeof behaviours[0]; ++i)
    if (strcmp(behaviours[i].name, name) == 0) return behaviours[i].run;
  return NULL;
}
