// opt::PrefixCache: the KV cache of prompt prefixes, kept after the sequences that computed them and copied into
// later sequences whose prompts start with the same tokens, so that only the rest of their prompt is computed.
// As vLLM's automatic prefix caching, it stores whole blocks of `block_tokens` positions (default 16): a block is
// found by its tokens and its parent block (the blocks before it), so a chain of blocks is a path in a tree of
// prefixes (SGLang's radix tree, with edges of one block). Within a byte budget: the least recently used block
// without children goes first.
//
// Reuse is exact: a position's keys and values depend only on the tokens up to it, and the kernels compute every
// row the same whatever the pass it is in, so a sequence that starts from a cached prefix gets the tokens and the
// logits of a cold one bit for bit. A cache serves one model (Batch::set_prefix_cache checks it); blocks of each KV
// cache element type (F32, F16, BF16) are kept apart and only ever copied into a cache of the same type.
//
// opt::Batch uses it (Batch::set_prefix_cache): add() copies the longest cached prefix of the prompt (whole blocks,
// at most prompt length - 1 positions, so that the pass computing the first logits has a token) into the new
// sequence's cache; once the prompt has been run, its whole blocks are stored. Only prompt positions are stored,
// and only after the pass that computed them: speculative proposals and rolled-back positions never reach it.
//
// Thread-safe: every member takes one mutex, so a cache may serve several Batches on several threads and a host
// may read stats() from any thread (opt-serve's scheduler thread copies and stores, HTTP threads read the stats).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opt/error.hpp"
#include "opt/model.hpp"

OPT_NAMESPACE_BEGIN

// A snapshot of a PrefixCache's counters.
struct PrefixCacheStats {
  uint64_t hits = 0;        // load() calls that copied at least one block
  uint64_t misses = 0;      // load() calls that copied nothing
  uint64_t hit_tokens = 0;  // positions copied by load()
  uint64_t stored_blocks = 0;  // blocks store() added
  uint64_t evictions = 0;   // blocks dropped to stay within the budget (clear() is not counted)
  size_t bytes = 0;         // bytes of keys and values held now
  size_t blocks = 0;        // blocks held now
  size_t budget = 0;        // the byte budget
  int64_t block_tokens = 0;
};

class PrefixCache {
 public:
  // A cache for `model`'s sequences (the model must outlive it) holding at most `budget_bytes` of keys and values,
  // in blocks of `block_tokens` positions. A budget below one block's bytes (KvCache::bytes_per_token x
  // block_tokens, which depends on the element type) stores nothing of that type: every load() is a miss.
  PrefixCache(const Model& model, size_t budget_bytes, int64_t block_tokens = 16)
      : model_(&model), budget_(budget_bytes), block_tokens_(block_tokens) {
    if (block_tokens < 1 || block_tokens > model.config().max_position_embeddings)
      throw input_error("PrefixCache: block_tokens = " + std::to_string(block_tokens) + ", expected 1 .. " +
                        std::to_string(model.config().max_position_embeddings) + " (max_position_embeddings)");
  }
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  const Model& model() const noexcept { return *model_; }
  int64_t block_tokens() const noexcept { return block_tokens_; }
  // Bytes one block of element type `type` takes.
  size_t block_bytes(dtype type) const noexcept {
    return KvCache::bytes_per_token(model_->config(), type) * size_t(block_tokens_);
  }

  // Copies into `kv` (empty, of this model's shape) the longest cached prefix of tokens[0, n) that is whole blocks
  // of at most `max_positions` positions, of kv's element type; kv then holds those positions (kv.size()). Returns
  // how many were copied and counts a hit (some) or a miss (none).
  int64_t load(const int32_t* tokens, int64_t n, int64_t max_positions, KvCache& kv) {
    check_shape(kv, "load");
    if (kv.size() != 0)
      throw input_error("PrefixCache::load: the KV cache holds " + std::to_string(kv.size()) +
                        " positions, expected an empty one");
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t limit = std::min({n, max_positions, kv.capacity()});
    const int64_t B = block_tokens_;
    uint64_t parent = 0;
    int64_t got = 0;
    const uint64_t now = ++clock_;
    for (; got + B <= limit; got += B) {
      auto it = index_.find(key(parent, kv.type(), tokens + got));
      if (it == index_.end()) break;
      Block& b = blocks_.at(it->second);
      copy_in(b, kv, got);
      touch(it->second, b, now);
      parent = it->second;
    }
    kv.advance(got);
    if (got > 0) {
      ++stats_.hits;
      stats_.hit_tokens += uint64_t(got);
    } else {
      ++stats_.misses;
    }
    return got;
  }

  // Stores the whole blocks of positions [0, n) of `kv` (computed by this model for tokens[0, n); n <= kv.size())
  // that are not cached yet, evicting least recently used blocks to make room; stops at the first block that does
  // not fit. The blocks already there count as used now.
  void store(const int32_t* tokens, int64_t n, const KvCache& kv) {
    check_shape(kv, "store");
    if (n < 0 || n > kv.size())
      throw input_error("PrefixCache::store: " + std::to_string(n) + " positions of a KV cache holding " +
                        std::to_string(kv.size()));
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t B = block_tokens_;
    const size_t bytes = block_bytes(kv.type());
    uint64_t parent = 0;
    const uint64_t now = ++clock_;
    for (int64_t at = 0; at + B <= n; at += B) {
      Key k = key(parent, kv.type(), tokens + at);
      auto it = index_.find(k);
      if (it != index_.end()) {
        touch(it->second, blocks_.at(it->second), now);
        parent = it->second;
        continue;
      }
      if (!make_room(bytes, parent)) return;
      const uint64_t id = next_id_++;
      Block& b = blocks_[id];
      b.key = k;
      b.data.resize(bytes);
      copy_out(kv, at, b);
      b.tick = now;
      leaves_.insert({now, id});
      index_.emplace(std::move(k), id);
      if (parent != 0) adopt(parent);
      bytes_ += bytes;
      ++stats_.stored_blocks;
      parent = id;
    }
  }

  // A new budget; evicts least recently used blocks down to it.
  void set_budget(size_t budget_bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    budget_ = budget_bytes;
    while (bytes_ > budget_ && evict_one(0)) {
    }
  }
  // Drops every block (the counters stay).
  void clear() {
    std::lock_guard<std::mutex> lk(mu_);
    blocks_.clear();
    index_.clear();
    leaves_.clear();
    bytes_ = 0;
  }

  PrefixCacheStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    PrefixCacheStats s = stats_;
    s.bytes = bytes_;
    s.blocks = blocks_.size();
    s.budget = budget_;
    s.block_tokens = block_tokens_;
    return s;
  }

 private:
  // A block is found by its parent (0: none, the prompt's first block), its element type and its tokens.
  using Key = std::tuple<uint64_t, int, std::vector<int32_t>>;
  struct Block {
    Key key;
    std::vector<std::byte> data;  // keys then values: [2][layers][heads][block_tokens][head_dim] elements
    uint64_t tick = 0;            // last use
    size_t children = 0;          // blocks whose parent it is; only a block without children is evicted
  };

  Key key(uint64_t parent, dtype type, const int32_t* tokens) const {
    return Key{parent, int(type), std::vector<int32_t>(tokens, tokens + block_tokens_)};
  }

  void check_shape(const KvCache& kv, const char* what) const {
    const Config& c = model_->config();
    if (kv.layers() != c.num_hidden_layers || kv.hidden() != c.hidden_size || kv.heads() != c.num_attention_heads)
      throw input_error(std::string("PrefixCache::") + what + ": a KV cache of " + std::to_string(kv.layers()) +
                        " layers x " + std::to_string(kv.heads()) + " heads x hidden " + std::to_string(kv.hidden()) +
                        ", expected the model's " + std::to_string(c.num_hidden_layers) + " x " +
                        std::to_string(c.num_attention_heads) + " x " + std::to_string(c.hidden_size));
  }

  // One (layer, head) run of a block: block_tokens positions of head_dim elements.
  size_t run_bytes(const KvCache& kv) const noexcept {
    return size_t(block_tokens_) * size_t(kv.ld()) * dtype_size(kv.type());
  }
  // kv's positions [at, at + block_tokens) -> b.data
  void copy_out(const KvCache& kv, int64_t at, Block& b) const {
    const size_t run = run_bytes(kv), es = dtype_size(kv.type());
    std::byte* dst = b.data.data();
    for (int kvi = 0; kvi < 2; ++kvi)
      for (int64_t l = 0; l < kv.layers(); ++l) {
        const auto* base = static_cast<const std::byte*>(kvi == 0 ? kv.k(l) : kv.v(l));
        for (int64_t h = 0; h < kv.heads(); ++h, dst += run)
          std::memcpy(dst, base + size_t(h * kv.head_stride() + at * kv.ld()) * es, run);
      }
  }
  // b.data -> kv's positions [at, at + block_tokens)
  void copy_in(const Block& b, KvCache& kv, int64_t at) const {
    const size_t run = run_bytes(kv), es = dtype_size(kv.type());
    const std::byte* src = b.data.data();
    for (int kvi = 0; kvi < 2; ++kvi)
      for (int64_t l = 0; l < kv.layers(); ++l) {
        auto* base = static_cast<std::byte*>(kvi == 0 ? kv.k(l) : kv.v(l));
        for (int64_t h = 0; h < kv.heads(); ++h, src += run)
          std::memcpy(base + size_t(h * kv.head_stride() + at * kv.ld()) * es, src, run);
      }
  }

  void touch(uint64_t id, Block& b, uint64_t now) {
    if (b.children == 0) {
      leaves_.erase({b.tick, id});
      leaves_.insert({now, id});
    }
    b.tick = now;
  }
  void adopt(uint64_t parent) {
    Block& p = blocks_.at(parent);
    if (p.children++ == 0) leaves_.erase({p.tick, parent});
  }

  // Evicts until `bytes` more fit in the budget, never `keep` (the parent of the block about to be stored).
  bool make_room(size_t bytes, uint64_t keep) {
    if (bytes > budget_) return false;
    while (bytes_ + bytes > budget_)
      if (!evict_one(keep)) return false;
    return true;
  }
  // Drops the least recently used block without children other than `keep`; false when there is none.
  bool evict_one(uint64_t keep) {
    auto it = leaves_.begin();
    if (it != leaves_.end() && it->second == keep) ++it;
    if (it == leaves_.end()) return false;
    const uint64_t id = it->second;
    leaves_.erase(it);
    auto bi = blocks_.find(id);
    const uint64_t parent = std::get<0>(bi->second.key);
    bytes_ -= bi->second.data.size();
    index_.erase(bi->second.key);
    blocks_.erase(bi);
    ++stats_.evictions;
    if (parent != 0) {
      Block& p = blocks_.at(parent);
      if (--p.children == 0) leaves_.insert({p.tick, parent});
    }
    return true;
  }

  const Model* model_;
  size_t budget_;
  int64_t block_tokens_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Block> blocks_;  // by id (ids start at 1)
  std::map<Key, uint64_t> index_;               // a block's id by its key
  std::set<std::pair<uint64_t, uint64_t>> leaves_;  // (last use, id) of the blocks without children
  uint64_t next_id_ = 1, clock_ = 0;
  size_t bytes_ = 0;
  PrefixCacheStats stats_;
};

OPT_NAMESPACE_END
