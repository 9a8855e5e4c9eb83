// Greedy generation with a KV cache: token-id prompts in, prompt + new ids out. Each row of a batch gets exactly
// what it would get alone: rows are kept unpadded (each sequence has its own cache and positions), so left,
// right or no padding in the caller's input cannot change a row's result.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/model.hpp"
#include "opt/sampler.hpp"

OPT_NAMESPACE_BEGIN

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int64_t eos_token_id = -1;  // -1: the model's config.eos_token_id
  size_t threads = 0;         // 0: all cores (when generate makes its own Workspace)
  // Called for each new token of each row; return false to stop that row.
  std::function<bool(size_t row, int32_t id)> on_token;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> sequences;   // per row: prompt + new ids, unpadded
  std::vector<std::vector<int32_t>> new_tokens;  // per row: new ids (ending with EOS if it stopped there)
  std::vector<std::vector<float>> first_logits;  // per row: the logits that chose the first new token
};

// Rows of a padded [B, T] batch, keeping the tokens whose mask is 1 (in order). Any mask pattern works, as in
// transformers (positions are cumsum(mask) - 1).
inline std::vector<std::vector<int32_t>> unpad(const std::vector<std::vector<int32_t>>& input_ids,
                                               const std::vector<std::vector<int32_t>>& attention_mask) {
  if (input_ids.size() != attention_mask.size())
    throw input_error("unpad: " + std::to_string(input_ids.size()) + " rows of input_ids but " +
                      std::to_string(attention_mask.size()) + " rows of attention_mask");
  std::vector<std::vector<int32_t>> rows(input_ids.size());
  for (size_t b = 0; b < input_ids.size(); ++b) {
    if (input_ids[b].size() != attention_mask[b].size())
      throw input_error("unpad: row " + std::to_string(b) + " has " + std::to_string(input_ids[b].size()) +
                        " ids but " + std::to_string(attention_mask[b].size()) + " mask values");
    for (size_t t = 0; t < input_ids[b].size(); ++t) {
      if (attention_mask[b][t] != 0 && attention_mask[b][t] != 1)
        throw input_error("unpad: attention_mask[" + std::to_string(b) + "][" + std::to_string(t) + "] = " +
                          std::to_string(attention_mask[b][t]) + ", expected 0 or 1");
      if (attention_mask[b][t]) rows[b].push_back(input_ids[b][t]);
    }
  }
  return rows;
}

inline GenerateResult generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& opts, Workspace& ws, bool keep_first_logits = false) {
  const Config& c = model.config();
  if (prompts.empty()) throw input_error("generate: empty batch (no prompts)");
  if (opts.max_new_tokens < 0)
    throw input_error("generate: max_new_tokens = " + std::to_string(opts.max_new_tokens) + ", expected >= 0");
  const int64_t eos = opts.eos_token_id >= 0 ? opts.eos_token_id : c.eos_token_id;
  const size_t B = prompts.size();
  for (size_t b = 0; b < B; ++b) {
    const int64_t len = int64_t(prompts[b].size());
    if (len == 0) throw input_error("generate: prompt " + std::to_string(b) + " is empty");
    if (len + opts.max_new_tokens > c.max_position_embeddings)
      throw input_error("generate: prompt " + std::to_string(b) + " has " + std::to_string(len) +
                        " tokens; with max_new_tokens " + std::to_string(opts.max_new_tokens) + " that is " +
                        std::to_string(len + opts.max_new_tokens) + " positions, beyond max_position_embeddings " +
                        std::to_string(c.max_position_embeddings));
    for (size_t j = 0; j < prompts[b].size(); ++j)
      if (prompts[b][j] < 0 || prompts[b][j] >= c.vocab_size)
        throw input_error("generate: prompt " + std::to_string(b) + " token " + std::to_string(j) + " = " +
                          std::to_string(prompts[b][j]) + " is outside the vocabulary [0, " +
                          std::to_string(c.vocab_size) + ")");
  }
  GenerateResult res;
  res.sequences = prompts;
  res.new_tokens.assign(B, {});
  if (keep_first_logits) res.first_logits.assign(B, {});
  if (opts.max_new_tokens == 0) return res;

  std::vector<KvCache> caches;
  caches.reserve(B);
  for (size_t b = 0; b < B; ++b) caches.emplace_back(c, int64_t(prompts[b].size()) + opts.max_new_tokens);
  std::vector<size_t> active(B);
  for (size_t b = 0; b < B; ++b) active[b] = b;
  std::vector<int32_t> next(B);
  std::vector<SequenceChunk> chunks;
  bool prefill = true;
  while (!active.empty()) {
    chunks.clear();
    for (size_t b : active) {
      if (prefill) chunks.push_back({&caches[b], prompts[b].data(), int64_t(prompts[b].size())});
      else chunks.push_back({&caches[b], &next[b], 1});
    }
    LogitsView logits = model.forward(chunks, ws);
    std::vector<size_t> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const size_t b = active[i];
      if (prefill && keep_first_logits) res.first_logits[b].assign(logits.row(int64_t(i)), logits.row(int64_t(i)) + c.vocab_size);
      const int32_t id = argmax(logits.row(int64_t(i)), c.vocab_size);
      next[b] = id;
      res.sequences[b].push_back(id);
      res.new_tokens[b].push_back(id);
      bool go = !(opts.stop_at_eos && id == eos) && int64_t(res.new_tokens[b].size()) < opts.max_new_tokens;
      if (opts.on_token && !opts.on_token(b, id)) go = false;
      if (go) still.push_back(b);
    }
    active.swap(still);
    prefill = false;
  }
  return res;
}

inline GenerateResult generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& opts = {}) {
  Workspace ws(opts.threads);
  return generate_ids(model, prompts, opts, ws);
}

OPT_NAMESPACE_END
