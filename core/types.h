// types.h — the vocabulary shared by every layer: status codes, opaque handles.
//
// The core never includes a CUDA header.  Streams, events and device pointers
// are opaque integers here; the shim casts CUstream/CUevent/CUdeviceptr to
// them.  Status codes use the CUDA driver's own numbering (CUresult) so that
// the shim can return them unchanged: "same error codes as the driver".
#pragma once

#include <cstddef>
#include <cstdint>

namespace cachalloc {

using Status = int;
inline constexpr Status kSuccess = 0;        // CUDA_SUCCESS
inline constexpr Status kInvalidValue = 1;   // CUDA_ERROR_INVALID_VALUE
inline constexpr Status kOutOfMemory = 2;    // CUDA_ERROR_OUT_OF_MEMORY
inline constexpr Status kDeinitialized = 4;  // CUDA_ERROR_DEINITIALIZED
inline constexpr Status kOperatingSystem = 304;  // CUDA_ERROR_OPERATING_SYSTEM: a pause's backup file failed
inline constexpr Status kNotReady = 600;     // CUDA_ERROR_NOT_READY
inline constexpr Status kNotSupported = 801; // CUDA_ERROR_NOT_SUPPORTED
// Not a driver code: the pointer lies outside every segment the allocator
// owns, so the caller should hand it to the real driver.
inline constexpr Status kNotOwned = -1;
// Not a driver code: an allocation asked for memory of a paused tag
// (pause_path.cpp).  The shim answers CUDA_ERROR_OUT_OF_MEMORY and logs.
inline constexpr Status kTagPaused = -2;

using DevicePtr = std::uintptr_t;  // CUdeviceptr
using StreamId = std::uintptr_t;   // CUstream; 0 is the legacy default stream
using EventId = std::uintptr_t;    // CUevent
using MemHandle = std::uintptr_t;  // CUmemGenericAllocationHandle
using FenceId = std::uintptr_t;    // a backend's fence (backend.h)
// A tag groups allocations that are paused and resumed together
// (pause_path.cpp); 0 is "untagged", which is never paused.
using TagId = std::uint32_t;
inline constexpr TagId kUntagged = 0;
// Where a tag's live blocks go while it is paused (docs/PAUSE.md): nowhere
// (contents lost), pinned host memory, a file, or pageable host memory
// (anonymous mmap: no pinning cost, reclaimable by the kernel, slower
// copies; torch_memory_saver's "mmap" backend).  The values are the C API's
// (cachalloc_set_tag_backup).
enum class BackupMode : std::uint8_t { none = 0, host = 1, disk = 2, pageable = 3 };
// Whether a backup of mode `m` lives in host memory (one buffer per tag).
inline constexpr bool in_host_memory(BackupMode m) { return m == BackupMode::host || m == BackupMode::pageable; }

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;

}  // namespace cachalloc
