// Speculative decoding that gives exactly plain decoding's tokens and logits, faster.
//
// A drafter proposes up to K tokens after a sequence; the model runs the sequence's pending token and the K
// proposals in one forward pass (one read of the weights for K + 1 positions); the longest prefix of proposals
// that greedy decoding would have chosen is kept, plus the model's own token after it, and the cache is rolled back
// past the rest. The kernels give a row the same bits whatever pass it is computed in (kernels.hpp: a token's
// logits do not depend on the batch or on how many tokens the pass holds), so every kept token is chosen from the
// logits a plain step computes: the output is plain greedy's, token for token and logit for logit, for any
// drafter, any K and any acceptance pattern.
//
// Drafters (Drafter): PromptLookupDrafter (the continuation of the latest earlier occurrence of the sequence's last
// n-gram: no second model), ModelDrafter (a model with the same vocabulary: a small OPT, or the target's own
// weights quantized, e.g. loaded with LoadOptions::quantize = int8).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/generate.hpp"
#include "opt/model.hpp"
#include "opt/sampler.hpp"

OPT_NAMESPACE_BEGIN

// Proposes tokens that might follow a sequence. Any proposal is safe: wrong ones only cost time.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to k tokens that might follow `tokens` (the whole sequence so far: prompt and new tokens); fewer or none
  // is fine. Called once per model pass; `tokens` extends or rewinds what an earlier call saw (a new sequence
  // starts over).
  virtual std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int64_t k) = 0;
};

// Prompt lookup (transformers' prompt_lookup_num_tokens): for n from max_ngram down to 1, the latest earlier
// occurrence of the sequence's last n tokens; proposes the (up to k) tokens that followed it.
class PromptLookupDrafter : public Drafter {
 public:
  explicit PromptLookupDrafter(int64_t max_ngram = 3) : n_(max_ngram) {
    if (max_ngram < 1)
      throw input_error("PromptLookupDrafter: n-gram size " + std::to_string(max_ngram) + ", expected >= 1");
  }
  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    const int64_t len = int64_t(t.size());
    for (int64_t n = std::min(n_, len - 1); n >= 1; --n) {
      // the latest start s < len - n with t[s, s + n) == t[len - n, len)
      for (int64_t s = len - n - 1; s >= 0; --s) {
        if (!std::equal(t.begin() + s, t.begin() + s + n, t.end() - n)) continue;
        const int64_t from = s + n, to = std::min(len, from + k);
        if (to > from) return std::vector<int32_t>(t.begin() + from, t.begin() + to);
      }
    }
    return {};
  }

 private:
  int64_t n_;
};

// A draft model with the target's vocabulary, decoding greedily. It keeps its own cache in step with the
// sequence: each call feeds the tokens it has not seen (after rolling back what the target rejected), then
// drafts k tokens one step at a time.
class ModelDrafter : public Drafter {
 public:
  // The model must outlive the drafter (Model copies share their weights, so passing a copy is cheap).
  explicit ModelDrafter(const Model& draft, size_t threads = 0) : m_(draft), ws_(threads) {}

  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    const Config& c = m_.config();
    const int64_t len = int64_t(t.size());
    k = std::min<int64_t>(k, c.max_position_embeddings - len);
    if (k <= 0 || len == 0) return {};
    if (kv_.capacity() < len + k) {  // grown as sequences grow (a fresh cache: everything is fed again)
      kv_ = KvCache(c, std::min<int64_t>(c.max_position_embeddings, std::max<int64_t>(64, 2 * (len + k))));
      seen_.clear();
    }
    // the cache holds seen_[0, kv_.size()): keep the prefix that still matches t (at least one token must be fed)
    int64_t keep = 0;
    while (keep < kv_.size() && keep < len - 1 && seen_[size_t(keep)] == t[size_t(keep)]) ++keep;
    kv_.truncate(keep);
    seen_.assign(t.begin(), t.end());
    for (int32_t id : t)
      if (id < 0 || id >= c.vocab_size) return {};  // the draft's vocabulary is smaller: nothing to say
    LogitsView lv = m_.forward({{&kv_, t.data() + keep, len - keep}}, ws_);
    std::vector<int32_t> out;
    for (int64_t j = 0; j < k; ++j) {
      int32_t id = argmax(lv.row(0), lv.cols);
      out.push_back(id);
      if (j + 1 == k) break;
      seen_.push_back(id);
      lv = m_.forward({{&kv_, &out.back(), 1}}, ws_);
    }
    return out;
  }

 private:
  Model m_;
  Workspace ws_;
  KvCache kv_;
  std::vector<int32_t> seen_;
};

struct SpeculativeOptions {
  int64_t draft_tokens = 4;  // K: the most tokens proposed for one pass
  // K adapts: it grows by one after a pass that accepted every proposal and halves after one that accepted none;
  // after 3 passes in a row without an accepted token, drafting pauses for a while (2, 4, ... up to 32 plain
  // steps), so a drafter that never guesses right costs little more than plain decoding.
  bool adaptive = true;
  // Tests and tools: each new token of each row with the logits that chose it.
  std::function<void(size_t row, int32_t id, const float* logits, int64_t n)> on_logits;
};

struct SpeculativeStats {
  int64_t passes = 0;      // model forward passes after the prompt passes
  int64_t proposed = 0;    // draft tokens verified
  int64_t accepted = 0;    // draft tokens kept
  int64_t new_tokens = 0;  // tokens generated (prompt passes' first tokens included)
  double acceptance() const noexcept { return proposed ? double(accepted) / double(proposed) : 0.0; }
  double tokens_per_pass() const noexcept { return passes ? double(new_tokens) / double(passes) : 0.0; }
};

namespace detail {

// K for the next pass, and the pause after passes that accept nothing (SpeculativeOptions::adaptive).
struct DraftLength {
  int64_t max_k, k, misses = 0, pause = 0, backoff = 2;
  bool adaptive;
  DraftLength(int64_t kmax, bool adapt) : max_k(kmax), k(kmax), adaptive(adapt) {}
  int64_t next() {
    if (!adaptive) return max_k;
    if (pause > 0) {
      --pause;
      return 0;
    }
    return k;
  }
  void update(int64_t proposed, int64_t accepted) {
    if (!adaptive || proposed == 0) return;
    if (accepted == proposed) k = std::min(max_k, k + 1), misses = 0, backoff = 2;
    else if (accepted == 0) k = std::max<int64_t>(1, k / 2), ++misses;
    else misses = 0;
    if (misses >= 3) pause = backoff, backoff = std::min<int64_t>(32, backoff * 2), misses = 0;
  }
};

}  // namespace detail

// Greedy generation of every prompt with speculative decoding: the same GenerateResult as generate_ids (same
// sequences, new tokens, first logits and finish reasons, bit for bit), with the drafter's proposals verified K at a
// time. Rows run one after another (each exactly as in a batch: see the top of this file). Greedy only: sampling
// options are an input_error. GenerateOptions::on_token works as in generate_ids.
inline GenerateResult speculative_generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                               const GenerateOptions& opts, Drafter& drafter,
                                               const SpeculativeOptions& so, Workspace& ws,
                                               bool keep_first_logits = false, SpeculativeStats* stats = nullptr) {
  const Config& c = model.config();
  if (!opts.sampling.greedy() || opts.sampling.repetition_penalty != 1.0f)
    throw input_error("speculative decoding: greedy only (no temperature, top-k, top-p or repetition penalty)");
  if (so.draft_tokens < 0 || so.draft_tokens > 64)
    throw input_error("speculative decoding: draft_tokens = " + std::to_string(so.draft_tokens) +
                      ", expected 0..64");
  if (prompts.empty()) throw input_error("generate: empty batch (no prompts)");
  if (opts.max_new_tokens < 0)
    throw input_error("generate: max_new_tokens = " + std::to_string(opts.max_new_tokens) + ", expected >= 0");
  const int64_t eos = opts.eos_token_id >= 0 ? opts.eos_token_id : c.eos_token_id;
  GenerateResult res;
  SpeculativeStats st;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<int32_t>& p = prompts[b];
    const int64_t len = int64_t(p.size());
    if (len == 0) throw input_error("generate: prompt " + std::to_string(b) + " is empty");
    if (opts.max_new_tokens > c.max_position_embeddings - len)
      throw input_error("generate: prompt " + std::to_string(b) + " has " + std::to_string(len) +
                        " tokens; with max_new_tokens " + std::to_string(opts.max_new_tokens) +
                        " that is beyond max_position_embeddings " + std::to_string(c.max_position_embeddings));
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j] < 0 || p[j] >= c.vocab_size)
        throw input_error("generate: prompt " + std::to_string(b) + " token " + std::to_string(j) + " = " +
                          std::to_string(p[j]) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                          ")");
    if (opts.max_new_tokens > 0 &&
        Batch::cache_bytes_for(c, len + opts.max_new_tokens, opts.kv_cache) > opts.max_cache_bytes)
      throw limit_error("generate: prompt " + std::to_string(b) + " with max_new_tokens " +
                        std::to_string(opts.max_new_tokens) + " needs more KV cache than the limit of " +
                        std::to_string(opts.max_cache_bytes) + " bytes (GenerateOptions::max_cache_bytes)");
  }
  if (keep_first_logits) res.first_logits.assign(prompts.size(), {});
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<int32_t> seq = prompts[b];
    std::vector<int32_t> fresh;
    FinishReason why = FinishReason::length;
    if (opts.max_new_tokens == 0) {
      res.sequences.push_back(seq), res.new_tokens.push_back(fresh), res.finish_reasons.push_back(why);
      continue;
    }
    KvCache kv(c, int64_t(seq.size()) + opts.max_new_tokens, opts.kv_cache);
    detail::DraftLength dl(so.draft_tokens, so.adaptive);
    bool done = false;
    // emits the token chosen from `logits`; false when the row has finished
    auto emit = [&](const float* logits) {
      const int32_t id = argmax(logits, c.vocab_size);
      if (keep_first_logits && fresh.empty()) res.first_logits[b].assign(logits, logits + c.vocab_size);
      if (so.on_logits) so.on_logits(b, id, logits, c.vocab_size);
      seq.push_back(id), fresh.push_back(id);
      ++st.new_tokens;
      if (opts.stop_at_eos && id == eos) why = FinishReason::eos, done = true;
      else if (int64_t(fresh.size()) >= opts.max_new_tokens) why = FinishReason::length, done = true;
      if (opts.on_token && !opts.on_token(b, id) && !done) why = FinishReason::stopped, done = true;
      return !done;
    };
    LogitsView lv = model.forward({{&kv, prompts[b].data(), int64_t(prompts[b].size())}}, ws);
    emit(lv.row(0));
    std::vector<int32_t> pass;
    while (!done) {
      // the pending token (the last one, not yet in the cache) and at most the proposals that could still be kept
      const int64_t room = opts.max_new_tokens - int64_t(fresh.size()) - 1;
      const int64_t k = std::min(dl.next(), room);
      std::vector<int32_t> draft = k > 0 ? drafter.propose(seq, k) : std::vector<int32_t>{};
      if (int64_t(draft.size()) > k) draft.resize(size_t(k));
      for (size_t j = 0; j < draft.size(); ++j)
        if (draft[j] < 0 || draft[j] >= c.vocab_size) draft.resize(j);  // beyond the vocabulary: cannot match
      pass.assign(1, seq.back());
      pass.insert(pass.end(), draft.begin(), draft.end());
      const int64_t before = kv.size(), nd = int64_t(draft.size());
      ForwardOptions fo;
      fo.all_logits = nd > 0;
      lv = model.forward({{&kv, pass.data(), int64_t(pass.size())}}, ws, fo);
      ++st.passes;
      st.proposed += nd;
      int64_t kept = 0;
      for (int64_t j = 0; j <= nd; ++j) {
        const bool more = emit(lv.row(fo.all_logits ? j : 0));
        const bool chosen = j < nd && seq.back() == draft[size_t(j)];
        if (chosen) ++kept;  // the model chose draft[j] itself: row j + 1's logits follow from the right context
        if (!more || !chosen) break;
      }
      st.accepted += kept;
      dl.update(nd, kept);
      kv.truncate(before + 1 + kept);  // the pending token and the kept proposals
    }
    res.sequences.push_back(seq), res.new_tokens.push_back(fresh), res.finish_reasons.push_back(why);
  }
  if (stats) *stats = st;
  return res;
}

// Text in, text out (generate()'s text layer: streaming, stop strings, batch_decode) with speculative decoding.
inline GenerateResult speculative_generate(const Model& model, const Tokenizer& tok,
                                          const std::vector<std::string>& prompts, const GenerateOptions& opts,
                                          Drafter& drafter, const SpeculativeOptions& so, Workspace& ws,
                                          SpeculativeStats* stats = nullptr) {
  return detail::generate_text(tok, prompts, opts, [&](const std::vector<std::vector<int32_t>>& ids,
                                                       const GenerateOptions& o) {
    return speculative_generate_ids(model, ids, o, drafter, so, ws, false, stats);
  });
}

OPT_NAMESPACE_END
