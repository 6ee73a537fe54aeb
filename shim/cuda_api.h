// cuda_api.h — <cuda.h> as the shim needs it.
//
// cuda.h maps some names to versioned ones with macros (cuGetProcAddress ->
// cuGetProcAddress_v2, cuMemAlloc -> cuMemAlloc_v2, ...).  The shim defines
// the real exported names itself, so it needs the 4-argument
// cuGetProcAddress and the 7.0 primary-context calls without the macros, and declarations of the _ptsz
// variants that cuda.h only declares for the driver's own build.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#undef cuGetProcAddress
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxRelease
#undef cuCtxDestroy

extern "C" {
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
// The CUDA 7.0 entry points (cuda.h maps these names to the _v2 ones).
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);  // before CUDA 4.0
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
}

// The 10.0 and 11.0 ABIs of cuGraphInstantiate (cudaTypedefs.h types them
// only for the driver's own build): RealDriver's pointers to them.
typedef CUresult(CUDAAPI* PFN_cachalloc_cuGraphInstantiate_v10000)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
