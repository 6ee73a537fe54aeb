// graph_entry_points.h — the exported graph hooks (graph_entry_points.cpp).
//
// Each is exported under the driver's exact symbol (an asm label: cuda.h
// renames cuGraphInstantiate, cuGraphExecUpdate and cuGraphAddNode to their
// newest ABI, while libcuda exports every ABI under its own name).  The
// C++ names are for hook_table.cpp.
#pragma once

#include "cuda_api.h"

#define CACHALLOC_GRAPH_HOOK(name, sym, params) extern "C" CUresult name params __asm__(sym)

CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphInstantiate_v1, "cuGraphInstantiate",
                     (CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphInstantiate_v2, "cuGraphInstantiate_v2",
                     (CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",
                     (CUgraphExec*, CUgraph, unsigned long long));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams",
                     (CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams_ptsz",
                     (CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphClone, "cuGraphClone",
                     (CUgraph*, CUgraph));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode",
                     (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphAddNode_v1, "cuGraphAddNode",
                     (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraphNodeParams*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphAddNode_v2, "cuGraphAddNode_v2",
                     (CUgraphNode*, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t, CUgraphNodeParams*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphExecUpdate_v1, "cuGraphExecUpdate",
                     (CUgraphExec, CUgraph, CUgraphNode*, CUgraphExecUpdateResult*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphExecUpdate_v2, "cuGraphExecUpdate_v2",
                     (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphExecChildGraphNodeSetParams, "cuGraphExecChildGraphNodeSetParams",
                     (CUgraphExec, CUgraphNode, CUgraph));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphDestroy, "cuGraphDestroy",
                     (CUgraph));
CACHALLOC_GRAPH_HOOK(cachalloc_cuGraphExecDestroy, "cuGraphExecDestroy",
                     (CUgraphExec));

#undef CACHALLOC_GRAPH_HOOK
