// Choosing the next token from logits. Greedy (argmax) is the default and matches transformers bit for bit.
#pragma once
#include <cstdint>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

// Index of the largest value; the first one on ties (torch.argmax). NaN compares as larger than everything,
// as in torch.
inline int32_t argmax(const float* logits, int64_t n) noexcept {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = logits[i], b = logits[best];
    if (b != b) break;               // NaN already chosen
    if (v > b || v != v) best = i;   // larger, or the first NaN
  }
  return int32_t(best);
}

OPT_NAMESPACE_END
