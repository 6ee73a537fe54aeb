// ipc_ops.h — CUDA IPC export of cachalloc blocks.
//
// cuIpcGetMemHandle describes a whole driver allocation; for a block carved
// out of a segment that is the segment, and an importer would map the
// segment's base: the wrong memory.  The driver's own handle format carries
// a size and an offset inside the physical allocation (measured on the H100,
// driver 580: it is how the driver exports the small cuMemAllocs it
// sub-allocates inside shared 2 MiB mappings), so cachalloc asks for the
// segment's handle and rewrites those two fields to describe the block.
// ANY importer, with or without cachalloc, then maps exactly the block; the
// driver reference-counts repeated opens and maps non-overlapping parts of
// one allocation independently.
//
// The driver documents no layout, so it is proven once per process before
// the first rewrite, from small allocations the driver itself places in a
// shared mapping (ipc_probe.h, ipc_layout.h); every export also checks that
// the segment's handle carries the segment's size.  A block that is exactly
// its segment (same base, requested size = segment size) needs no rewrite:
// it gets the driver's own handle, layout proven or not.  Any other block,
// when the layout is refuted or cannot be proven, fails with
// CUDA_ERROR_NOT_SUPPORTED and a logged reason instead of describing the
// wrong memory — a block at its segment's start too, whose unrewritten
// handle would export the whole segment.  An exported block
// is retained after its free (never reused) until its segment goes back to
// the driver, which keeps freed exported memory alive for importers
// (measured).  Blocks of expandable segments (cuMemMap'ed memory) cannot be
// exported through legacy IPC: CUDA_ERROR_INVALID_VALUE, the driver's own
// answer for such memory, with a message naming the remedy.
// cuIpcOpenMemHandle and cuIpcCloseMemHandle need nothing: the handle
// already describes the block.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

CUresult do_ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr ptr);
// cuMemGetHandleForAddressRange (dma-buf for a NIC or another driver): the
// driver keeps the memory alive while the fd is open, so every block the
// range touches is retained after its free exactly like an IPC export.
CUresult do_get_handle_for_address_range(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                         unsigned long long flags);

}  // namespace cachalloc::shim
