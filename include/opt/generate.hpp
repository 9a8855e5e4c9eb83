// Generation: token-id prompts in, prompt + new ids out, written on the step loop of opt::Batch. Greedy by
// default. Each row of a batch gets exactly what it would get alone: rows are kept unpadded (each sequence has its
// own cache and positions), so left, right or no padding in the caller's input cannot change a row's result.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/batch.hpp"
#include "opt/model.hpp"
#include "opt/sampler.hpp"

OPT_NAMESPACE_BEGIN

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int64_t eos_token_id = -1;  // -1: the model's config.eos_token_id
  size_t threads = 0;         // 0: all cores (when generate makes its own Workspace)
  SamplingOptions sampling;   // greedy by default
  // Called for each new token of each row; return false to stop that row.
  std::function<bool(size_t row, int32_t id)> on_token;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> sequences;   // per row: prompt + new ids, unpadded
  std::vector<std::vector<int32_t>> new_tokens;  // per row: new ids (ending with EOS if it stopped there)
  std::vector<std::vector<float>> first_logits;  // per row: the logits that chose the first new token
  std::vector<FinishReason> finish_reasons;      // per row: eos, length or stopped
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

// Runs every prompt to its end (EOS, max_new_tokens, or on_token returning false) with the step loop of
// opt::Batch. keep_first_logits fills GenerateResult::first_logits.
inline GenerateResult generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& opts, Workspace& ws, bool keep_first_logits = false) {
  const Config& c = model.config();
  if (prompts.empty()) throw input_error("generate: empty batch (no prompts)");
  if (opts.max_new_tokens < 0)
    throw input_error("generate: max_new_tokens = " + std::to_string(opts.max_new_tokens) + ", expected >= 0");
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
  Batch batch(model, ws);
  SequenceOptions so;
  so.max_new_tokens = opts.max_new_tokens;
  so.stop_at_eos = opts.stop_at_eos;
  so.eos_token_id = opts.eos_token_id;
  so.sampling = opts.sampling;
  std::vector<SeqId> ids(B);
  std::map<SeqId, size_t> row_of;
  for (size_t b = 0; b < B; ++b) {
    ids[b] = batch.add(prompts[b], so);
    row_of[ids[b]] = b;
  }
  GenerateResult res;
  if (keep_first_logits) res.first_logits.assign(B, {});
  bool first = true;
  while (!batch.empty()) {
    for (const SeqLogits& l : batch.compute()) {
      const size_t b = row_of[l.seq];
      if (first && keep_first_logits) res.first_logits[b].assign(l.logits, l.logits + l.size);
      StepToken t = batch.accept(l.seq, batch.choose(l));
      if (opts.on_token && !opts.on_token(b, t.token) && !t.finished) batch.stop(l.seq);
    }
    first = false;
  }
  for (size_t b = 0; b < B; ++b) {
    res.sequences.push_back(batch.tokens(ids[b]));
    res.new_tokens.push_back(batch.new_tokens(ids[b]));
    res.finish_reasons.push_back(batch.finish_reason(ids[b]));
  }
  return res;
}

inline GenerateResult generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& opts = {}) {
  Workspace ws(opts.threads);
  return generate_ids(model, prompts, opts, ws);
}

OPT_NAMESPACE_END
