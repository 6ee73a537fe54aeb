// address_ops.h — the driver calls that reveal an allocation's identity.
//
// cuMemGetAddressRange and the pointer attributes must describe the
// program's block, exactly as the driver describes a cuMemAlloc of the
// requested size (measured on the H100: the driver reports the requested
// size, not a rounded one, and "not found" past it), never the cachalloc
// segment around it: numba memsets the range it is told, and would
// overwrite the neighbours.  Pointers outside every cachalloc segment go to
// the driver unchanged.
//
//   live block      RANGE_START_ADDR / RANGE_SIZE / the address range are the
//                   block's start and requested size; BUFFER_ID is unique per
//                   allocation (ContextState::buffer_id); every other
//                   attribute is the driver's answer for the segment, which
//                   is what the driver itself says for the small cuMemAllocs
//                   it sub-allocates inside shared 2 MiB mappings
//                   (MAPPING_BASE_ADDR/MAPPING_SIZE/MEMORY_BLOCK_ID describe
//                   the physical allocation; SYNC_MEMOPS applies to it).
//                   ALLOWED_HANDLE_TYPES is 0, as for cuMemAlloc memory:
//                   no block can be exported with cuMemExportToShareableHandle.
//   cached memory,  the driver's answers for freed memory: a single attribute
//   or past the     -> CUDA_ERROR_INVALID_VALUE, the address range ->
//   requested size  CUDA_ERROR_NOT_FOUND, cuPointerGetAttributes -> the
//                   driver's own defaults for an address it does not know.
//   pinned host     the same rules for blocks of the host cache (host_ops.h):
//   blocks          RANGE_*, the address range and BUFFER_ID describe the
//                   block as an allocation of the requested size; freed
//                   (cached) blocks and bytes past the request are unknown.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

CUresult do_mem_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);
CUresult do_pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);
CUresult do_pointer_get_attributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr);
CUresult do_pointer_set_attribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr);
// cuMemRetainAllocationHandle: a block is cuMemAlloc memory to the program,
// for which the driver answers CUDA_ERROR_INVALID_VALUE; never the physical
// page handle of an expandable segment (its offset 0 is another block).
CUresult do_mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr);
// cuMemMap / cuMemUnmap / cuMemSetAccess by the program on an address inside
// a cachalloc segment: the driver refuses them on cuMemAlloc memory, and
// letting them through would map, unmap or revoke cachalloc's own pages.
// True when the call must be refused with CUDA_ERROR_INVALID_VALUE.
bool inside_cachalloc_memory(CUdeviceptr ptr);
// cuGreenCtxCreate: green contexts are not supported (docs/INTERPOSER.md, the audit);
// says so once on the log.
void warn_green_context();
// cuGreenCtxStreamCreate made `stream`: every context's plain frees fence
// from here on and the stream waits for the work before (stream_order.h);
// a fence recorded in the primary context covers its green contexts' work.
void note_green_stream(CUstream stream);

}  // namespace cachalloc::shim
