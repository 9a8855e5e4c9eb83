// opt::Batch: the step loop a host drives itself (streaming, continuous batching). Sequences join between steps
// (prompt ids), each step runs ONE forward pass over every active sequence (a newcomer's whole prompt, the
// others' last token), picks each next token with the sequence's own sampler, and retires finished sequences,
// freeing their KV cache at once. Each sequence gets exactly what it would get alone: it has its own cache and
// positions, and the kernels compute every row independently of the others.
//
// A sequence may speculate (SequenceOptions::speculation, made by opt::speculation() in speculative.hpp): step()
// then runs its pending token and a drafter's proposals in the same pass, keeps what its sampler accepts and
// reports every kept token (several StepTokens in a step). speculative.hpp owns that logic; Batch only calls it.
//
// With a PrefixCache (set_prefix_cache, prefix_cache.hpp) a new sequence starts from the cached keys and values of
// the longest cached prefix of its prompt and computes only the rest; each prompt, once run, is stored there.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/model.hpp"
#include "opt/prefix_cache.hpp"
#include "opt/sampler.hpp"

OPT_NAMESPACE_BEGIN

enum class FinishReason { none, eos, length, stopped };

inline const char* to_string(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::eos: return "eos";
    case FinishReason::length: return "length";
    case FinishReason::stopped: return "stopped";
  }
  return "?";
}

// The hook speculative decoding plugs into Batch::step (speculative.hpp implements it: opt::speculation()).
class Speculation {
 public:
  // One sequence's speculation (its drafter's state, its draft length).
  class Sequence {
   public:
    virtual ~Sequence() = default;
    // The proposals to verify in the next pass after `tokens` (the sequence so far; its last token is pending):
    // at most `room`, each in [0, vocab). Empty: a plain step.
    virtual void draft(const std::vector<int32_t>& tokens, int64_t room, int64_t vocab, std::vector<int32_t>& out) = 0;
    // After the pass: rows + j * cols (j = 0 .. draft.size()) are the logits after the pending token and
    // draft[0, j) (only row 0 without a draft). Picks the tokens with `sampler` (history: `tokens`, which take()
    // extends) and hands each to take(token, the logits that chose it) in order, while take returns true (false:
    // the sequence finished). Returns how many proposals were kept.
    virtual int64_t verify(const float* rows, int64_t cols, const std::vector<int32_t>& draft, Sampler& sampler,
                           const std::vector<int32_t>& tokens,
                           const std::function<bool(int32_t, const float*)>& take) = 0;
  };
  virtual ~Speculation() = default;
  // A new sequence's state (Batch::add), decoding with `target`.
  virtual std::unique_ptr<Sequence> start(const Model& target) const = 0;
};

struct SequenceOptions {
  int64_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int64_t eos_token_id = -1;  // -1: the model's config.eos_token_id
  SamplingOptions sampling;   // greedy by default
  dtype kv_cache = dtype::F32;  // the KV cache's element type: F32 (exact), F16 or BF16 (half the bytes)
  // Speculative decoding in step() (opt::speculation(drafter, ...), speculative.hpp); null: plain steps. Greedy
  // sequences get plain greedy's tokens and logits exactly; sampling ones the same distribution, reproducibly.
  std::shared_ptr<const Speculation> speculation;
  // With the batch's PrefixCache (Batch::set_prefix_cache): start from the longest cached prefix of the prompt, and
  // store the prompt once run. The tokens and logits are the same either way.
  bool prefix_cache = true;
};

using SeqId = uint64_t;

// What one step produced for one sequence.
struct StepToken {
  SeqId seq = 0;
  int32_t token = 0;
  bool finished = false;
  FinishReason reason = FinishReason::none;
  const float* logits = nullptr;  // step(): the logits that chose the token (valid until the next step); else null
};

// The logits one step computed for one sequence (valid until the next step).
struct SeqLogits {
  SeqId seq = 0;
  const float* logits = nullptr;
  int64_t size = 0;
};

class Batch {
 public:
  // A batch with its own Workspace (threads: 0 = all cores).
  explicit Batch(const Model& model, size_t threads = 0)
      : model_(&model), own_ws_(std::make_unique<Workspace>(threads)), ws_(own_ws_.get()) {}
  // A batch using the caller's Workspace.
  Batch(const Model& model, Workspace& ws) : model_(&model), ws_(&ws) {}

  // Adds a sequence; it joins at the next step. Throws input_error for an empty prompt, ids outside the vocabulary,
  // or prompt + max_new_tokens beyond the model's context (max_position_embeddings): never a silent truncation.
  SeqId add(std::vector<int32_t> prompt, const SequenceOptions& opts = {}) {
    const Config& c = model_->config();
    if (prompt.empty()) throw input_error("Batch::add: empty prompt");
    if (opts.max_new_tokens < 0)
      throw input_error("Batch::add: max_new_tokens = " + std::to_string(opts.max_new_tokens) + ", expected >= 0");
    for (size_t j = 0; j < prompt.size(); ++j)
      if (prompt[j] < 0 || prompt[j] >= c.vocab_size)
        throw input_error("Batch::add: prompt token " + std::to_string(j) + " = " + std::to_string(prompt[j]) +
                          " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    const int64_t len = int64_t(prompt.size());
    if (opts.max_new_tokens > c.max_position_embeddings - len)  // (no overflow for any max_new_tokens)
      throw input_error("Batch::add: prompt of " + std::to_string(len) + " tokens + max_new_tokens " +
                        std::to_string(opts.max_new_tokens) + " = " + std::to_string(len + std::min(opts.max_new_tokens, c.max_position_embeddings)) +
                        (opts.max_new_tokens > c.max_position_embeddings ? "+" : "") +
                        " positions, beyond max_position_embeddings " + std::to_string(c.max_position_embeddings));
    opts.sampling.validate(c.vocab_size);  // logit_bias ids inside the vocabulary
    if (!ops::attention_cache_type(opts.kv_cache))
      throw input_error(std::string("Batch::add: KV cache element type ") + to_string(opts.kv_cache) +
                        " (expected F32, F16 or BF16)");
    const int64_t need = len + opts.max_new_tokens;
    const size_t bytes = cache_bytes_for(c, need, opts.kv_cache);
    if (opts.max_new_tokens > 0 && cache_bytes() + bytes > max_cache_bytes_)
      throw limit_error("Batch::add: a KV cache of " + std::to_string(bytes) + " bytes (" + std::to_string(need) +
                        " positions) on top of the " + std::to_string(cache_bytes()) + " bytes held would exceed " +
                        std::to_string(max_cache_bytes_) + " bytes (OPT_MAX_KV_BYTES / Batch::set_max_cache_bytes)");
    Seq s;
    s.prompt_len = prompt.size();
    s.tokens = std::move(prompt);
    s.tokens.reserve(size_t(need));  // a step appends without allocating
    s.opts = opts;
    s.eos = opts.eos_token_id >= 0 ? opts.eos_token_id : c.eos_token_id;
    s.sampler = Sampler(opts.sampling, s.prompt_len);  // penalties count the ids after the prompt
    if (opts.speculation) s.spec = opts.speculation->start(*model_);
    if (opts.max_new_tokens == 0) {
      s.finished = true;
      s.reason = FinishReason::length;
    } else {
      s.cache = std::make_unique<KvCache>(c, need, opts.kv_cache, model_->layers());  // (a stage's: its layers)
      if (prefix_ && opts.prefix_cache) {  // a cached prefix, leaving a token for the pass that gives the logits
        prefix_->load(s.tokens.data(), len, len - 1, *s.cache);
        s.store_prompt = true;
      }
    }
    const SeqId id = next_id_++;
    seqs_.emplace(id, std::move(s));
    return id;
  }

  // KV cache bytes a sequence of `positions` positions needs: keys and values of every layer, elements of `type`.
  static size_t cache_bytes_for(const Config& c, int64_t positions, dtype type = dtype::F32) noexcept {
    return size_t(positions) * KvCache::bytes_per_token(c, type);
  }
  // The cap on the KV cache all unfinished sequences may hold together (default OPT_MAX_KV_BYTES).
  void set_max_cache_bytes(size_t bytes) noexcept { max_cache_bytes_ = bytes; }
  size_t max_cache_bytes() const noexcept { return max_cache_bytes_; }

  // The cache of prompt prefixes new sequences start from and prompts are stored in (null: none). It must be the
  // cache of this batch's model (else an input_error). Sequences added before keep what they started from.
  void set_prefix_cache(std::shared_ptr<PrefixCache> cache) {
    if (cache && &cache->model() != model_)
      throw input_error("Batch::set_prefix_cache: the PrefixCache belongs to another model");
    prefix_ = std::move(cache);
  }
  const std::shared_ptr<PrefixCache>& prefix_cache() const noexcept { return prefix_; }

  // Sequences that have not finished.
  size_t active() const noexcept {
    size_t n = 0;
    for (auto& [id, s] : seqs_) n += !s.finished;
    return n;
  }
  bool empty() const noexcept { return active() == 0; }

  // Lower level, step 1: one forward pass for every active sequence; returns each one's next-token logits
  // (the batch's own list, valid until the next compute() or step(): a step allocates nothing once the first
  // decode step has sized the buffers). Follow it with accept() for each (or use step(), which does both).
  const std::vector<SeqLogits>& compute() {
    gather("compute", false);
    std::vector<SeqLogits>& out = logits_;
    out.clear();
    if (chunks_.empty()) return out;
    LogitsView lv = model_->forward(chunks_, *ws_);
    store_prompts();
    for (size_t i = 0; i < order_.size(); ++i) out.push_back({order_[i], lv.row(int64_t(i)), lv.cols});
    return out;
  }

  // Lower level, step 2: appends `token` to a sequence and applies its stop rules (EOS, max_new_tokens).
  StepToken accept(SeqId id, int32_t token) {
    Seq& s = get(id, "accept");
    if (s.finished) throw input_error("Batch::accept: sequence " + std::to_string(id) + " has finished");
    if (token < 0 || token >= model_->config().vocab_size)
      throw input_error("Batch::accept: token " + std::to_string(token) + " is outside the vocabulary");
    s.tokens.push_back(token);
    StepToken st{id, token, false, FinishReason::none};
    if (s.opts.stop_at_eos && token == s.eos) st.reason = FinishReason::eos;
    else if (int64_t(s.tokens.size() - s.prompt_len) >= s.opts.max_new_tokens) st.reason = FinishReason::length;
    if (st.reason != FinishReason::none) {
      retire(s, st.reason);
      st.finished = true;
    }
    return st;
  }

  // The token the sequence's own sampler picks from logits computed for it (greedy unless it samples).
  int32_t choose(const SeqLogits& l) {
    Seq& s = get(l.seq, "choose");
    return s.sampler.sample(l.logits, l.size, s.tokens);
  }

  // One step: compute(), then each sequence's sampler picks its token, then accept(). The list is the batch's
  // own, valid until the next compute() or step(). A speculating sequence (SequenceOptions::speculation) may get
  // several tokens, in order, from one pass (compute() and accept() never speculate).
  const std::vector<StepToken>& step() { return step(nullptr); }

  // step(), handing each token to on_token as it is accepted, in order; on_token returning false stops that
  // sequence there, as stop() would (a speculating sequence keeps none of the tokens after it).
  const std::vector<StepToken>& step(const std::function<bool(const StepToken&)>& on_token) {
    std::vector<StepToken>& out = step_out_;
    out.clear();
    bool speculates = false;
    for (auto& [id, s] : seqs_) speculates = speculates || (!s.finished && s.spec);
    if (!speculates) {  // compute() and accept(): the plain step
      const std::vector<SeqLogits>& ls = compute();
      choose_all(ls);
      for (size_t i = 0; i < ls.size(); ++i) accept_token(ls[i].seq, chosen_[i], ls[i].logits, on_token, out);
      return out;
    }
    gather("step", true);
    if (chunks_.empty()) return out;
    const LogitsView lv = model_->forward(chunks_, *ws_);
    store_prompts();  // (before verify: only the prompt's positions, which no rollback reaches)
    for (size_t i = 0; i < order_.size(); ++i) {
      const SeqId id = order_[i];
      Seq& s = *live_[i];
      const float* first = lv.row(s.row);
      if (!s.spec) {
        accept_chosen(id, first, lv.cols, on_token, out);
        continue;
      }
      const int64_t before = s.cache->size() - chunks_[i].n;
      const int64_t kept = s.spec->verify(first, lv.cols, s.draft, s.sampler, s.tokens, [&](int32_t t, const float* l) {
        out.push_back(accept(id, t));
        out.back().logits = l;
        const bool more = (!on_token || on_token(out.back())) && !out.back().finished;
        if (!more && !out.back().finished) stop(id);
        return more;
      });
      if (!s.finished && !s.draft.empty()) s.cache->truncate(before + 1 + kept);  // drop the rejected proposals
    }
    return out;
  }

  // The host stops a sequence (a stop string, a disconnected client): its cache is freed at once.
  void stop(SeqId id) {
    Seq& s = get(id, "stop");
    if (!s.finished) retire(s, FinishReason::stopped);
  }
  // Forgets a sequence (finished or not) and everything it holds.
  void release(SeqId id) {
    get(id, "release");
    seqs_.erase(id);
  }

  bool contains(SeqId id) const noexcept { return seqs_.count(id) != 0; }
  bool finished(SeqId id) const { return get(id, "finished").finished; }
  FinishReason finish_reason(SeqId id) const { return get(id, "finish_reason").reason; }
  // Prompt followed by the tokens generated so far.
  const std::vector<int32_t>& tokens(SeqId id) const { return get(id, "tokens").tokens; }
  std::vector<int32_t> new_tokens(SeqId id) const {
    const Seq& s = get(id, "new_tokens");
    return std::vector<int32_t>(s.tokens.begin() + int64_t(s.prompt_len), s.tokens.end());
  }
  size_t prompt_length(SeqId id) const { return get(id, "prompt_length").prompt_len; }
  // Bytes of KV cache held by unfinished sequences.
  size_t cache_bytes() const noexcept {
    size_t b = 0;
    for (auto& [id, s] : seqs_) b += s.cache ? s.cache->bytes() : 0;
    return b;
  }
  const Model& model() const noexcept { return *model_; }
  Workspace& workspace() noexcept { return *ws_; }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    size_t prompt_len = 0;
    SequenceOptions opts;
    int64_t eos = 2;
    Sampler sampler;
    std::unique_ptr<Speculation::Sequence> spec;  // null: plain steps
    std::vector<int32_t> draft, pass;  // step(): this pass's proposals; pending token + proposals
    int64_t row = 0;                   // step(): the sequence's first logits row in the pass
    std::unique_ptr<KvCache> cache;
    bool store_prompt = false;  // the prompt goes to the PrefixCache once run
    bool finished = false;
    FinishReason reason = FinishReason::none;
  };
  Seq& get(SeqId id, const char* what) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) throw input_error(std::string("Batch::") + what + ": no sequence " + std::to_string(id));
    return it->second;
  }
  const Seq& get(SeqId id, const char* what) const { return const_cast<Batch*>(this)->get(id, what); }
  // The chunks of the next pass (chunks_, order_, live_ and each Seq::row): every active sequence's pending tokens.
  // With `drafts`, a speculating sequence's decode step drafts, and its chunk is the pending token and the
  // proposals, with every position's logits.
  void gather(const char* who, bool drafts) {
    const int64_t vocab = model_->config().vocab_size;
    chunks_.clear();
    order_.clear();
    live_.clear();
    int64_t rows = 0;
    for (auto& [id, s] : seqs_) {
      if (s.finished) continue;
      const int64_t have = s.cache->size();
      const int64_t pending = int64_t(s.tokens.size()) - have;
      if (pending <= 0)
        throw input_error(std::string("Batch::") + who + ": sequence " + std::to_string(id) +
                          " has no pending token (call accept)");
      s.draft.clear();
      if (drafts && s.spec && pending == 1)  // a decode step: proposals that could still be kept
        s.spec->draft(s.tokens, s.opts.max_new_tokens - int64_t(s.tokens.size() - s.prompt_len) - 1, vocab, s.draft);
      SequenceChunk ch{s.cache.get(), s.tokens.data() + have, pending};
      if (!s.draft.empty()) {
        s.pass.assign(1, s.tokens.back());
        s.pass.insert(s.pass.end(), s.draft.begin(), s.draft.end());
        ch = {s.cache.get(), s.pass.data(), int64_t(s.pass.size()), true};
      }
      s.row = rows;
      rows += ch.all_logits ? ch.n : 1;
      chunks_.push_back(ch);
      order_.push_back(id);
      live_.push_back(&s);
    }
  }
  // accept() of the token the sequence's sampler picks from its logits, into out and to on_token (false stops
  // the sequence there).
  void accept_chosen(SeqId id, const float* logits, int64_t n,
                     const std::function<bool(const StepToken&)>& on_token, std::vector<StepToken>& out) {
    Seq& s = get(id, "step");
    accept_token(id, s.sampler.sample(logits, n, s.tokens), logits, on_token, out);
  }
  void accept_token(SeqId id, int32_t token, const float* logits,
                    const std::function<bool(const StepToken&)>& on_token, std::vector<StepToken>& out) {
    out.push_back(accept(id, token));
    out.back().logits = logits;
    if (on_token && !on_token(out.back()) && !out.back().finished) stop(id);
  }
  // chosen_[i] = choose() of compute()'s sequence i, the sequences spread over
  // the workspace's threads (each sampler reads only its own logits and history and draws from its own stream, so
  // the tokens are those of picking them one by one; with 16 sequences a scalar argmax over 50272 logits each cost
  // ~5% of opt-serve's step on one thread while the other waited).
  void choose_all(const std::vector<SeqLogits>& ls) {
    chosen_.resize(ls.size());
    failed_.assign(ls.size(), nullptr);
    const auto pick = [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        try {
          chosen_[i] = choose(ls[i]);
        } catch (...) {
          failed_[i] = std::current_exception();
        }
      }
    };
    if (ls.size() > 1) ws_->pool().parallel_for(ls.size(), 1, pick);
    else pick(0, ls.size());
    for (const std::exception_ptr& e : failed_)
      if (e) std::rethrow_exception(e);
  }
  // After a pass: the prompts it completed go to the PrefixCache.
  void store_prompts() {
    for (auto& [id, s] : seqs_)
      if (s.store_prompt && !s.finished && s.cache->size() >= int64_t(s.prompt_len)) {
        s.store_prompt = false;
        if (prefix_) prefix_->store(s.tokens.data(), int64_t(s.prompt_len), *s.cache);
      }
  }
  static void retire(Seq& s, FinishReason r) {
    s.finished = true;
    s.reason = r;
    s.cache.reset();  // free the KV cache now
  }

  const Model* model_;
  std::unique_ptr<Workspace> own_ws_;
  Workspace* ws_;
  std::map<SeqId, Seq> seqs_;  // ordered: passes are laid out in the order sequences joined
  SeqId next_id_ = 1;
  size_t max_cache_bytes_ = OPT_MAX_KV_BYTES;
  std::shared_ptr<PrefixCache> prefix_;
  std::vector<SequenceChunk> chunks_;
  std::vector<SeqId> order_;
  std::vector<Seq*> live_;  // step(): the sequences of order_
  std::vector<SeqLogits> logits_;   // compute()'s result
  std::vector<StepToken> step_out_;  // step()'s result
  std::vector<int32_t> chosen_;              // step(): each sequence's pick (choose_all)
  std::vector<std::exception_ptr> failed_;   // choose_all(): what a pick threw
};

OPT_NAMESPACE_END
