// size_policy.h — how a request becomes a block size, a pool and a segment size.
//
// The numbers are PyTorch's CUDACachingAllocator's, so that a program sees
// the same rounding and the same segment sizes under cachalloc:
//   blocks are multiples of 512 B (or power-of-two divisions when configured);
//   requests <= 1 MiB live in the small pool, carved from 2 MiB segments;
//   requests in (1 MiB, 10 MiB) get a 20 MiB segment; larger ones their size
//   rounded up to 2 MiB.
#pragma once

#include <cstddef>

#include "config.h"
#include "types.h"

namespace cachalloc {

inline constexpr std::size_t kMinBlockSize = 512;        // every block a multiple of this
inline constexpr std::size_t kSmallSize = 1 * MiB;       // largest "small" request
inline constexpr std::size_t kSmallBuffer = 2 * MiB;     // small-pool segment size
inline constexpr std::size_t kLargeBuffer = 20 * MiB;    // segment for 1–10 MiB requests
inline constexpr std::size_t kMinLargeAlloc = 10 * MiB;  // from here segments fit the request
inline constexpr std::size_t kRoundLarge = 2 * MiB;      // large segments round to this
// Requests above this fail as out of memory before any rounding: no device
// has 4 EiB, and below it every size computed from a request (rounded at
// most to the next power of two, then to 2 MiB) fits in a size_t, so no
// rounding can wrap around to a small block.
inline constexpr std::size_t kMaxRequestSize = std::size_t{1} << 62;

// Block size for a request of `size` bytes under `config`.  Sizes above
// kMaxRequestSize give SIZE_MAX (never a wrapped, small size).
std::size_t round_size_general(std::size_t size, const Config& config);

// round_size_general, with the common case inline (it is on every malloc):
// a small request (below 2 MiB, power2_interval 0) without power-of-two
// divisions for its interval is a multiple of 512.
inline std::size_t round_size(std::size_t size, const Config& config) {
  if (size - 1 < kSmallSize && config.roundup_power2_divisions[0] <= 1) [[likely]]
    return (size + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
  return round_size_general(size, config);
}

// The same from the divisions alone: the front's copy (front.h), whose hit
// then reads no configuration of the core.
using Power2Divisions = decltype(Config::roundup_power2_divisions);
std::size_t round_size_general(std::size_t size, const Power2Divisions& divisions);
inline std::size_t round_size(std::size_t size, const Power2Divisions& divisions) {
  if (size - 1 < kSmallSize && divisions[0] <= 1) [[likely]]
    return (size + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
  return round_size_general(size, divisions);
}

// Segment size to ask the device for when no cached block fits `rounded`;
// SIZE_MAX (never a wrapped, small size) when rounding up would overflow.
std::size_t segment_size_for(std::size_t rounded);

inline bool is_small_request(std::size_t rounded) { return rounded <= kSmallSize; }

// Index of the roundup_power2_divisions interval that `size` falls in.
int power2_interval(std::size_t size);

}  // namespace cachalloc
