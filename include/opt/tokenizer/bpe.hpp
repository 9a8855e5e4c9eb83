// Byte-level BPE over token ids: a (pair -> rank, merged id) table, the merge loop of HF's GPT2Tokenizer.bpe
// (repeatedly take the adjacent pair of lowest rank and merge all its occurrences left to right), and a bounded,
// thread-safe cache from pre-token bytes to ids.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

inline uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

inline uint64_t hash_bytes(std::string_view s) noexcept {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix64(h ^ w);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix64(h ^ w ^ (static_cast<uint64_t>(n) << 56));
}

// Open-addressing map (left id, right id) -> (rank, merged id).
class merge_table {
 public:
  struct merge {
    int32_t rank;
    int32_t id;
  };
  static constexpr merge kNone{INT32_MAX, -1};

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, kNone);
    size_ = 0;
  }
  // Inserts or overwrites (a later line of merges.txt wins, as in Python's dict(zip(merges, ranks))).
  void set(int32_t a, int32_t b, merge m) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & (keys_.size() - 1);
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = k;
    vals_[i] = m;
  }
  merge get(int32_t a, int32_t b) const noexcept {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (true) {
      const uint64_t s = keys_[i];
      if (s == k) return vals_[i];
      if (s == kEmpty) return kNone;
      i = (i + 1) & (keys_.size() - 1);
    }
  }
  size_t size() const noexcept { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) noexcept {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const noexcept { return mix64(k) & (keys_.size() - 1); }
  void grow() {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<merge> vals = std::move(vals_);
    reserve(std::max<size_t>(keys.size(), 8));
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) set(static_cast<int32_t>(keys[i] >> 32), static_cast<int32_t>(keys[i] & 0xFFFFFFFFu), vals[i]);
  }

  std::vector<uint64_t> keys_ = std::vector<uint64_t>(16, kEmpty);
  std::vector<merge> vals_ = std::vector<merge>(16, kNone);
  size_t size_ = 0;
};

// The reference merge loop, a direct transcription of GPT2Tokenizer.bpe: O(n) per merge step. `syms` holds the
// ids of the word's symbols on entry and the final ids on return.
inline void bpe_merge_naive(const merge_table& merges, std::vector<int32_t>& syms) {
  while (syms.size() > 1) {
    merge_table::merge best = merge_table::kNone;
    int32_t first = -1, second = -1;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const merge_table::merge m = merges.get(syms[i], syms[i + 1]);
      if (m.rank < best.rank) {
        best = m;
        first = syms[i];
        second = syms[i + 1];
      }
    }
    if (best.id < 0) break;
    size_t w = 0;
    for (size_t i = 0; i < syms.size();) {
      if (i + 1 < syms.size() && syms[i] == first && syms[i + 1] == second) {
        syms[w++] = best.id;
        i += 2;
      } else {
        syms[w++] = syms[i++];
      }
    }
    syms.resize(w);
  }
}

// The same merges in O(n log n) for long words: a heap of candidate pairs ordered by (rank, position). All pairs
// of one rank are merged left to right before the pairs they create are queued, which is exactly the naive loop's
// "merge every occurrence of the best pair, then look again".
inline void bpe_merge_heap(const merge_table& merges, std::vector<int32_t>& syms) {
  const size_t n = syms.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = (i + 1 < n) ? static_cast<int32_t>(i + 1) : -1;
  }
  // entries are rank << 32 | position
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const merge_table::merge m = merges.get(syms[pos], syms[next[pos]]);
    if (m.id >= 0) heap.push((static_cast<int64_t>(m.rank) << 32) | pos);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<int32_t> touched;
  while (!heap.empty()) {
    const int32_t rank = static_cast<int32_t>(heap.top() >> 32);
    touched.clear();
    while (!heap.empty() && static_cast<int32_t>(heap.top() >> 32) == rank) {
      const int32_t pos = static_cast<int32_t>(heap.top() & 0xFFFFFFFF);
      heap.pop();
      if (!alive[pos] || next[pos] < 0) continue;
      const int32_t right = next[pos];
      const merge_table::merge m = merges.get(syms[pos], syms[right]);
      if (m.rank != rank) continue;  // stale: one side was merged since
      syms[pos] = m.id;
      alive[right] = 0;
      next[pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = pos;
      touched.push_back(pos);
    }
    for (int32_t pos : touched) {
      if (!alive[pos]) continue;
      push(prev[pos]);
      push(pos);
    }
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

// Words shorter than this use the naive loop, which is faster for them.
inline constexpr size_t kBpeHeapThreshold = 48;

inline void bpe_merge(const merge_table& merges, std::vector<int32_t>& syms) {
  if (syms.size() < kBpeHeapThreshold)
    bpe_merge_naive(merges, syms);
  else
    bpe_merge_heap(merges, syms);
}

// A bounded cache raw pre-token bytes -> ids, split into shards with one mutex each so that several threads can
// encode with one Tokenizer. A full shard is cleared (no LRU bookkeeping on the hot path).
class bpe_cache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kSlotsPerShard = 1u << 13;     // at most half used: 4096 words per shard
  static constexpr size_t kMaxWordBytes = 64;            // longer pre-tokens are not cached

  bpe_cache() : shards_(kShards) {}

  // Appends the cached ids of `word` to out and returns true, or returns false.
  bool lookup(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
    shard& s = shards_[h >> 60];
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.slots.empty()) return false;
    size_t i = (h >> 32) & (kSlotsPerShard - 1);
    while (true) {
      const entry& e = s.slots[i];
      if (e.key_len == 0) return false;
      if (e.hash == static_cast<uint32_t>(h) && e.key_len == word.size() &&
          std::memcmp(s.keys.data() + e.key_off, word.data(), word.size()) == 0) {
        out.insert(out.end(), s.ids.begin() + e.ids_off, s.ids.begin() + e.ids_off + e.ids_len);
        return true;
      }
      i = (i + 1) & (kSlotsPerShard - 1);
    }
  }

  void insert(std::string_view word, uint64_t h, const int32_t* ids, size_t n) const {
    if (word.empty() || word.size() > kMaxWordBytes) return;
    shard& s = shards_[h >> 60];
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.slots.empty() || 2 * (s.used + 1) > kSlotsPerShard) {
      s.slots.assign(kSlotsPerShard, entry{});
      s.keys.clear();
      s.ids.clear();
      s.used = 0;
    }
    size_t i = (h >> 32) & (kSlotsPerShard - 1);
    while (s.slots[i].key_len != 0) {
      const entry& e = s.slots[i];
      if (e.hash == static_cast<uint32_t>(h) && e.key_len == word.size() && std::memcmp(s.keys.data() + e.key_off, word.data(), word.size()) == 0)
        return;  // another thread was first
      i = (i + 1) & (kSlotsPerShard - 1);
    }
    entry& e = s.slots[i];
    e.hash = static_cast<uint32_t>(h);
    e.key_off = static_cast<uint32_t>(s.keys.size());
    e.key_len = static_cast<uint16_t>(word.size());
    e.ids_off = static_cast<uint32_t>(s.ids.size());
    e.ids_len = static_cast<uint16_t>(n);
    s.keys.append(word.data(), word.size());
    s.ids.insert(s.ids.end(), ids, ids + n);
    ++s.used;
  }

  void clear() const {
    for (shard& s : shards_) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.slots.clear();
      s.keys.clear();
      s.ids.clear();
      s.used = 0;
    }
  }

 private:
  struct entry {  // 16 bytes: the slot array of a shard stays small enough for the L2 cache
    uint32_t hash = 0;  // low bits of the hash (shard and slot come from the high bits)
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, ids_len = 0;
  };
  struct shard {
    std::mutex mutex;
    std::vector<entry> slots;
    std::string keys;
    std::vector<int32_t> ids;
    size_t used = 0;
  };
  mutable std::vector<shard> shards_;
};

}  // namespace detail
OPT_NAMESPACE_END
