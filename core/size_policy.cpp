// size_policy.cpp — rounding rules (see size_policy.h for the numbers' origin).
#include "size_policy.h"

#include <bit>
#include <limits>

namespace cachalloc {

namespace {

constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();

// Saturates at SIZE_MAX instead of wrapping around to a small number.
std::size_t round_up(std::size_t n, std::size_t unit) {
  if (n > kSizeMax - (unit - 1)) return kSizeMax;
  return (n + unit - 1) / unit * unit;
}

// Rounds `size` up to the next of `divisions` equal steps between the power
// of two below it and the one above: with 4 divisions, 1200 MiB lies in
// [1024, 2048) whose steps are 256 MiB, so it becomes 1280 MiB.
std::size_t round_to_power2_division(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor_pow2 = std::bit_floor(size);
  const std::size_t step = floor_pow2 / std::bit_floor(divisions);
  if (step == 0) return floor_pow2 << 1;
  return round_up(size, step);
}

}  // namespace

int power2_interval(std::size_t size) {
  // Interval 0 holds everything below 2 MiB (PyTorch's intervals start at
  // 1 MiB), the last one everything from 2^(20+15) bytes up.
  const int log2 = std::bit_width(size) - 1;
  const int index = log2 > 20 ? log2 - 20 : 0;
  return index < kPower2Intervals ? index : kPower2Intervals - 1;
}

namespace {
// (One body for both entries: each inlines it, so the core's large
// requests, which take this path on every malloc, pay no second call.)
inline std::size_t round_general(std::size_t size, const Power2Divisions& per_interval) {
  if (size < kMinBlockSize) return kMinBlockSize;
  if (size > kMaxRequestSize) return kSizeMax;
  const std::size_t divisions = per_interval[power2_interval(size)];
  if (divisions > 1 && size > kMinBlockSize * divisions) return round_to_power2_division(size, divisions);
  return round_up(size, kMinBlockSize);
}
}  // namespace

std::size_t round_size_general(std::size_t size, const Config& config) {
  return round_general(size, config.roundup_power2_divisions);
}

std::size_t round_size_general(std::size_t size, const Power2Divisions& divisions) {
  return round_general(size, divisions);
}

std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

}  // namespace cachalloc
