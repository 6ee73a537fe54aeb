// address_info.h — what a CachingAllocator tells about one address
// (CachingAllocator::query): the shim's answers to the driver calls that
// reveal an allocation.  A header of its own so that caching_allocator.h
// stays within a few hundred lines.
#pragma once

#include <cstddef>
#include <cstdint>

#include "types.h"

namespace cachalloc {

// What the allocator knows about one address: the answer to the driver
// calls that reveal an allocation (address ranges, pointer attributes, IPC),
// which must describe the program's block, not the segment around it.
struct AddressInfo {
  // ptr lies in [block, block + requested) of an allocated block: the range
  // the driver would report for a cuMemAlloc of `requested` bytes.  Past the
  // requested size, and in cached or pending memory, the driver would say
  // "not allocated".
  bool live = false;
  DevicePtr block = 0;
  std::size_t requested = 0;
  std::uint64_t id = 0;      // the allocation's serial (unique per allocator)
  bool exported = false;
  DevicePtr segment = 0;     // the segment (driver allocation or reservation) holding ptr
  std::size_t segment_size = 0;
  bool expandable = false;
  TagId tag = kUntagged;     // the segment's tag
  bool paused = false;       // its tag is paused (pages released)
};

}  // namespace cachalloc
