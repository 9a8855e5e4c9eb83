// Generation, written on the step loop of opt::Batch: token-id prompts in, prompt + new ids out (generate_ids),
// or text in, text out (generate: encode, generate, batch_decode, with streaming and stop strings). Greedy by
// default. Each row of a batch gets exactly what it would get alone: rows are kept unpadded (each sequence has its
// own cache and positions), so left, right or no padding in the caller's input cannot change a row's result.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/batch.hpp"
#include "opt/model.hpp"
#include "opt/sampler.hpp"
#include "opt/tokenizer.hpp"

OPT_NAMESPACE_BEGIN

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int64_t eos_token_id = -1;  // -1: the model's config.eos_token_id
  size_t threads = 0;         // 0: all cores (when generate makes its own Workspace)
  size_t max_cache_bytes = OPT_MAX_KV_BYTES;  // cap on the batch's KV cache, checked before allocating
  SamplingOptions sampling;   // greedy by default
  dtype kv_cache = dtype::F32;  // the KV cache's element type: F32 (exact, the default), F16 or BF16 (half the bytes)
  // Called for each new token of each row; return false to stop that row.
  std::function<bool(size_t row, int32_t id)> on_token;

  // ---- text API only (generate with a Tokenizer) ----
  std::vector<std::string> stop;      // stop strings: the text ends before the first one; it is never emitted
  bool return_full_text = true;       // texts start with their prompt (batch_decode of the whole sequence)
  bool skip_special_tokens = true;    // as the seed's batch_decode(skip_special_tokens=True)
  std::optional<bool> clean_up_tokenization_spaces;  // unset: the tokenizer's (true for OPT, as transformers)
  size_t max_prompt_tokens = 0;       // > 0: prompts longer than this keep their first ids (HF truncation)
  // Streaming: called with each new token and the text it completes (always whole UTF-8, possibly empty while
  // a character or a possible stop string is incomplete); at the end of a row, once more with id -1 and the
  // rest. The pieces of a row concatenate to its completion. Return false to stop that row.
  std::function<bool(size_t row, int32_t id, std::string_view piece)> on_text;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> sequences;   // per row: prompt + new ids, unpadded
  std::vector<std::vector<int32_t>> new_tokens;  // per row: new ids (ending with EOS if it stopped there)
  std::vector<std::vector<float>> first_logits;  // per row: the logits that chose the first new token
  std::vector<FinishReason> finish_reasons;      // per row: eos, length or stopped
  // text API only
  std::vector<std::string> texts;        // per row: prompt + completion (or the completion alone)
  std::vector<std::string> completions;  // per row: the new text, cut before a stop string
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

namespace detail {
// What generate_ids and speculative_generate_ids check before anything is allocated: the options, every prompt
// (not empty, ids in the vocabulary, prompt + max_new_tokens within the context) and the whole batch's KV cache.
inline void check_generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                           const GenerateOptions& opts) {
  const Config& c = model.config();
  if (prompts.empty()) throw input_error("generate: empty batch (no prompts)");
  if (opts.max_new_tokens < 0)
    throw input_error("generate: max_new_tokens = " + std::to_string(opts.max_new_tokens) + ", expected >= 0");
  if (!ops::attention_cache_type(opts.kv_cache))
    throw input_error(std::string("generate: KV cache element type ") + to_string(opts.kv_cache) +
                      " (expected F32, F16 or BF16)");
  const size_t B = prompts.size();
  size_t cache_total = 0;
  for (size_t b = 0; b < B; ++b) {
    const int64_t len = int64_t(prompts[b].size());
    if (len == 0) throw input_error("generate: prompt " + std::to_string(b) + " is empty");
    if (opts.max_new_tokens > c.max_position_embeddings - len)  // (no overflow for any max_new_tokens)
      throw input_error("generate: prompt " + std::to_string(b) + " has " + std::to_string(len) +
                        " tokens; with max_new_tokens " + std::to_string(opts.max_new_tokens) + " that is " +
                        std::to_string(len + std::min(opts.max_new_tokens, c.max_position_embeddings)) +
                        (opts.max_new_tokens > c.max_position_embeddings ? "+" : "") +
                        " positions, beyond max_position_embeddings " + std::to_string(c.max_position_embeddings));
    for (size_t j = 0; j < prompts[b].size(); ++j)
      if (prompts[b][j] < 0 || prompts[b][j] >= c.vocab_size)
        throw input_error("generate: prompt " + std::to_string(b) + " token " + std::to_string(j) + " = " +
                          std::to_string(prompts[b][j]) + " is outside the vocabulary [0, " +
                          std::to_string(c.vocab_size) + ")");
    if (opts.max_new_tokens > 0)
      cache_total += Batch::cache_bytes_for(c, len + opts.max_new_tokens, opts.kv_cache);
  }
  // the whole batch's KV cache, checked before anything is allocated
  if (cache_total > opts.max_cache_bytes)
    throw limit_error("generate: " + std::to_string(B) + " prompts with max_new_tokens " +
                      std::to_string(opts.max_new_tokens) + " need " + std::to_string(cache_total) +
                      " bytes of KV cache, more than the limit of " + std::to_string(opts.max_cache_bytes) +
                      " bytes (GenerateOptions::max_cache_bytes, default OPT_MAX_KV_BYTES)");
}

// The per-sequence options of a generate call.
inline SequenceOptions sequence_options(const GenerateOptions& opts) {
  SequenceOptions so;
  so.max_new_tokens = opts.max_new_tokens;
  so.stop_at_eos = opts.stop_at_eos;
  so.eos_token_id = opts.eos_token_id;
  so.sampling = opts.sampling;
  so.kv_cache = opts.kv_cache;
  return so;
}
}  // namespace detail

// Runs every prompt to its end (EOS, max_new_tokens, or on_token returning false) with the step loop of
// opt::Batch. keep_first_logits fills GenerateResult::first_logits.
inline GenerateResult generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& opts, Workspace& ws, bool keep_first_logits = false) {
  detail::check_generate(model, prompts, opts);
  const size_t B = prompts.size();
  Batch batch(model, ws);
  batch.set_max_cache_bytes(opts.max_cache_bytes);
  const SequenceOptions so = detail::sequence_options(opts);
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

// ---- text -----------------------------------------------------------------------------------------------------

// One sequence's new text as tokens arrive: a streaming detokenizer plus stop strings. Text that might be the
// start of a stop string is held back until it is known not to be one.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<std::string> stop, DecodeOptions opts)
      : tok_(tok), dec_(tok, opts), stop_(std::move(stop)) {
    for (auto& s : stop_)
      if (s.empty()) throw input_error("generate: empty stop string");
  }

  // Feeds one new id; returns the text that can be emitted now. Ids the tokenizer lacks (a model may have more
  // rows than the tokenizer has tokens) add no text.
  std::string push(int32_t id) {
    if (stopped_) return std::string();
    if (id >= 0 && size_t(id) < tok_.vocab_size()) text_ += dec_.push(id);
    return take(false);
  }
  // At the end of the sequence: whatever was held back.
  std::string finish() {
    if (!stopped_) text_ += dec_.flush();
    return take(true);
  }
  bool stopped() const noexcept { return stopped_; }
  const std::string& text() const noexcept { return text_; }

 private:
  std::string take(bool all) {
    size_t end = text_.size();
    if (!stop_.empty() && !stopped_) {
      size_t longest = 0;
      for (auto& s : stop_) longest = std::max(longest, s.size());
      const size_t from = emitted_ > longest ? emitted_ - longest : 0;
      size_t hit = std::string::npos;
      for (auto& s : stop_) hit = std::min(hit, text_.find(s, from));
      if (hit != std::string::npos) {
        stopped_ = true;
        text_.resize(hit);
        end = hit;
      } else if (!all) {
        // hold back the longest tail that is a proper prefix of a stop string
        size_t hold = 0;
        for (auto& s : stop_)
          for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k)
            if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
              hold = k;
              break;
            }
        end = text_.size() - hold;
      }
    }
    if (end <= emitted_) return std::string();
    std::string piece = text_.substr(emitted_, end - emitted_);
    emitted_ = end;
    return piece;
  }

  const Tokenizer& tok_;
  StreamDecoder dec_;
  std::vector<std::string> stop_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

// Text in, text out, as the seed's worker does: encode (BOS prepended), generate, batch_decode. With
// return_full_text (the default) each answer starts with its prompt and, without a stop string, equals
// transformers' batch_decode(sequences, skip_special_tokens=True). Streams through opts.on_text.
namespace detail {
// The text layer of generate() over any ids engine: run(ids, options) generates as generate_ids does.
template <class Run>
GenerateResult generate_text(const Tokenizer& tok, const std::vector<std::string>& prompts, const GenerateOptions& opts,
                             Run&& run) {
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(prompts.size());
  for (auto& p : prompts) {
    ids.push_back(tok.encode(p, true));
    if (opts.max_prompt_tokens > 0 && ids.back().size() > opts.max_prompt_tokens) ids.back().resize(opts.max_prompt_tokens);
  }
  DecodeOptions dopts;
  dopts.skip_special_tokens = opts.skip_special_tokens;
  dopts.clean_up_tokenization_spaces = opts.clean_up_tokenization_spaces;
  std::vector<std::unique_ptr<TextStream>> streams;
  for (size_t b = 0; b < prompts.size(); ++b) streams.push_back(std::make_unique<TextStream>(tok, opts.stop, dopts));
  GenerateOptions o = opts;
  o.on_token = [&](size_t row, int32_t id) {
    TextStream& ts = *streams[row];
    std::string piece = ts.push(id);
    bool go = !ts.stopped();
    if (opts.on_token && !opts.on_token(row, id)) go = false;
    if (opts.on_text && !opts.on_text(row, id, piece)) go = false;
    return go;
  };
  GenerateResult r = run(ids, o);
  r.texts.resize(prompts.size());
  r.completions.resize(prompts.size());
  // ids the tokenizer lacks decode to nothing, as in TextStream
  auto known = [&](std::vector<int32_t> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](int32_t id) { return id < 0 || size_t(id) >= tok.vocab_size(); }),
            v.end());
    return v;
  };
  for (size_t b = 0; b < prompts.size(); ++b) {
    TextStream& ts = *streams[b];
    std::string rest = ts.finish();
    if (opts.on_text) opts.on_text(b, -1, rest);
    if (ts.stopped() && r.finish_reasons[b] != FinishReason::eos) r.finish_reasons[b] = FinishReason::stopped;
    r.completions[b] = ts.text();
    if (!opts.return_full_text) r.texts[b] = r.completions[b];
    else if (!ts.stopped()) r.texts[b] = tok.decode(known(r.sequences[b]), dopts);  // exactly batch_decode
    else {
      DecodeOptions raw = dopts;
      raw.clean_up_tokenization_spaces = false;
      std::string full = tok.decode(known(ids[b]), raw) + ts.text();
      r.texts[b] = tok.clean_up(dopts) ? detail::clean_up_tokenization(std::move(full)) : full;
    }
  }
  return r;
}
}  // namespace detail

inline GenerateResult generate(const Model& model, const Tokenizer& tok, const std::vector<std::string>& prompts,
                               const GenerateOptions& opts, Workspace& ws) {
  return detail::generate_text(tok, prompts, opts, [&](const std::vector<std::vector<int32_t>>& ids,
                                                       const GenerateOptions& o) {
    return generate_ids(model, ids, o, ws);
  });
}

inline GenerateResult generate(const Model& model, const Tokenizer& tok, const std::vector<std::string>& prompts,
                               const GenerateOptions& opts = {}) {
  Workspace ws(opts.threads);
  return generate(model, tok, prompts, opts, ws);
}

// One prompt, one answer (starting with the prompt unless return_full_text is false).
inline std::string generate(const Model& model, const Tokenizer& tok, const std::string& prompt,
                            const GenerateOptions& opts = {}) {
  return generate(model, tok, std::vector<std::string>{prompt}, opts).texts[0];
}

OPT_NAMESPACE_END
