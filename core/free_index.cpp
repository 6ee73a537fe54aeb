// free_index.cpp — validate()'s view of the bins (free_index.h).
#include "free_index.h"

namespace cachalloc {

const char* StreamBins::check(const Block* b) const {
  const int bin = bin_of(b->size);
  bool found = false;
  const Block* prev = nullptr;
  for (const Block* x = heads_[bin]; x != nullptr; prev = x, x = x->free_next) {
    if (x->free_prev != prev) return "free-bin list not linked both ways";
    if (prev != nullptr && prev->size > x->size) return "free bin not sorted by size";
    if (bin_of(x->size) != bin) return "block in the wrong free bin";
    found = found || x == b;
  }
  if (!found) return "pooled block missing from its stream's free bin";
  if ((level2_[bin / kLinear] & (1u << (bin % kLinear))) == 0 ||
      (level1_ & (std::uint64_t{1} << (bin / kLinear))) == 0)
    return "free-bin bitmap misses a non-empty bin";
  return nullptr;
}

}  // namespace cachalloc
