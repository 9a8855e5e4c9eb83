// Speculative decoding that gives exactly plain decoding's tokens and logits (greedy) or its distribution
// (sampling), faster.
//
// A drafter proposes up to K tokens after a sequence; the model runs the sequence's pending token and the K
// proposals in one forward pass (one read of the weights for K + 1 positions); the longest prefix of proposals
// that greedy decoding would have chosen is kept, plus the model's own token after it, and the cache is rolled back
// past the rest. The kernels give a row the same bits whatever pass it is computed in (kernels.hpp: a token's
// logits do not depend on the batch or on how many tokens the pass holds), so every kept token is chosen from the
// logits a plain step computes: the output is plain greedy's, token for token and logit for logit, for any
// drafter, any K and any acceptance pattern.
//
// A sampling sequence uses speculative sampling (Leviathan et al. 2023, Chen et al. 2023): with p the sequence's
// sampling distribution (Sampler::distribution: repetition penalty, temperature, top-k, top-p) at a proposal's
// position and q the distribution the drafter drew it from, the proposal x is kept with probability
// min(1, p(x) / q(x)); otherwise the token is drawn from max(0, p - q) normalized and the pass ends there; after
// K kept proposals the bonus token is drawn from p. A deterministic proposal (prompt lookup, a greedy draft model)
// has q all on x: kept with probability p(x), else drawn from p without x. Every token is then distributed as
// plain sampling's; the draws come from the sequence's seeded stream, so the same seed gives the same output.
//
// Inside opt::Batch (SequenceOptions::speculation = opt::speculation(drafter, options)), a speculating sequence
// shares each step's pass with every other sequence; speculative_generate_ids runs on that Batch.
//
// Drafters (Drafter): PromptLookupDrafter (the continuation of the latest earlier occurrence of the sequence's last
// n-gram: no second model), ModelDrafter (a model with the same vocabulary: a small OPT, or the target's own
// weights quantized, e.g. loaded with LoadOptions::quantize = int8).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "opt/batch.hpp"
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
  // A drafter that samples: the distribution (over the vocabulary, probabilities) that proposal j of the latest
  // propose() was drawn from. Null (the default): the proposals are deterministic (q is all on the proposal).
  virtual const std::vector<double>* draft_distribution(size_t j) const {
    (void)j;
    return nullptr;
  }
  // A drafter for another sequence of a batch (the same proposals, its own state), or null when this one can serve
  // every sequence (it keeps no state between calls, or re-syncs itself as ModelDrafter does).
  virtual std::shared_ptr<Drafter> fork() const { return nullptr; }
  // What one proposed token costs, in plain decode steps of `target` (what adaptive K weighs drafting with):
  // 0 (the default) for a drafter that costs next to nothing, as prompt lookup.
  virtual double token_cost(const Model& target) const {
    (void)target;
    return 0.0;
  }
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
  explicit ModelDrafter(const Model& draft, size_t threads = 0)
      : m_(draft), ws_(std::make_shared<Workspace>(threads)) {}

  // Its own cache, the same model and Workspace (the sequences of a batch draft one after another).
  std::shared_ptr<Drafter> fork() const override { return std::shared_ptr<Drafter>(new ModelDrafter(m_, ws_)); }

  // A draft step reads the draft's weights as a target step reads the target's: the ratio of those bytes.
  double token_cost(const Model& target) const override {
    const size_t t = target.decode_weight_bytes();
    return t ? double(m_.decode_weight_bytes()) / double(t) : 1.0;
  }

  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    const Config& c = m_.config();
    const int64_t len = int64_t(t.size());
    k = std::min<int64_t>(k, c.max_position_embeddings - len);
    if (k <= 0 || len == 0) return {};
    // grown as sequences grow, keeping what it holds (a fresh cache fed the whole sequence again: at opt-1.3b
    // int8 a 60-token prefill, ~6 ms a token over 64 new tokens); on 4 KiB pages: on the Intel VM of 2026-12-06
    // the fresh huge pages of an opt-1.3b int8 self-draft's caches (64 positions, then 2 x the sequence) took
    // 0.4-0.8 s of a 64-token speculative run, 4 KiB pages 18-20 ms, and its draft token went from 69-73 to 55 ms
    const int64_t room = std::min<int64_t>(c.max_position_embeddings, std::max<int64_t>(64, 2 * (len + k)));
    if (kv_.capacity() == 0) kv_ = KvCache(c, room, dtype::F32, {}, false);
    else if (kv_.capacity() < len + k) kv_.reserve(c, room);
    // the cache holds seen_[0, kv_.size()): keep the prefix that still matches t (at least one token must be fed)
    int64_t keep = 0;
    while (keep < kv_.size() && keep < len - 1 && seen_[size_t(keep)] == t[size_t(keep)]) ++keep;
    kv_.truncate(keep);
    seen_.assign(t.begin(), t.end());
    for (int32_t id : t)
      if (id < 0 || id >= c.vocab_size) return {};  // the draft's vocabulary is smaller: nothing to say
    LogitsView lv = m_.forward({{&kv_, t.data() + keep, len - keep}}, *ws_);
    std::vector<int32_t> out;
    for (int64_t j = 0; j < k; ++j) {
      int32_t id = argmax(lv.row(0), lv.cols);
      out.push_back(id);
      if (j + 1 == k) break;
      seen_.push_back(id);
      lv = m_.forward({{&kv_, &out.back(), 1}}, *ws_);
    }
    return out;
  }

 private:
  ModelDrafter(const Model& m, std::shared_ptr<Workspace> ws) : m_(m), ws_(std::move(ws)) {}
  Model m_;
  std::shared_ptr<Workspace> ws_;
  KvCache kv_;
  std::vector<int32_t> seen_;
};

struct SpeculativeOptions {
  // K: the most tokens proposed for one pass. 5 (4 until 2026-12-07): with every proposal kept (an int8 self-draft
  // of opt-1.3b bf16, 2 threads), K <= 5 beat K <= 4 on both machines measured: Zen 5 1.33-1.61x (4 runs) against
  // 1.43-1.53x, the Intel VM 1.43x against 1.35-1.39x (fixed K); 6 and more were slower on both (a pass of 7 rows
  // costs ~1.6 steps on Zen 5, where the FMAs bound it)
  int64_t draft_tokens = 5;
  // K adapts: the first pass proposes min(K, 4); after each pass, K is the length in 1..K that gives the most
  // tokens per unit of time by a cost model: the acceptance rate a (each proposal kept with probability a, as
  // estimated from the latest passes) makes a pass of k proposals yield (1 - a^(k+1)) / (1 - a) tokens, and costs
  // k draft tokens (Drafter::token_cost; for a greedy sequence, once timed, the drafter's measured time per token
  // over the measured plain step) plus a verification of k + 1 rows: max(1, (k + 1) / verify_rows) plain steps
  // until passes are timed, then the timed passes of k + 1 rows (others scaled from the nearest timed length);
  // a pass that keeps all its proposals tries one more when that length was never timed.
  // After a pass that accepted nothing K is 1, and after 3 of them in a row drafting pauses for a while (2, 4, ...
  // up to 32 plain steps), so a drafter that never guesses right costs little more than plain decoding; drafting
  // pauses the same way when the best K makes fewer tokens per step than plain decoding (a drafter that guesses
  // half right at the cost of a step).
  // (Proposing K whatever the acceptance, an int8 self-draft of opt-1.3b bf16 at K = 8 that kept ~90% of its
  // proposals was slower than plain decoding: 9-row passes cost ~1.9 steps on Zen 5.)
  bool adaptive = true;
  // Rows one verification pass takes for about the cost of a plain step (the pass reads the weights once; past
  // this many rows its arithmetic shows): adaptive K's prior, before passes are timed. 0 (the default):
  // verify_rows_for(target), by the kernels in use and the target's weight type; else >= 1.
  double verify_rows = 0.0;
  // A proposed token's cost in plain steps; < 0: the drafter's own estimate (Drafter::token_cost).
  double draft_cost = -1.0;
  // speculative_generate_ids (tests and tools): each new token of each row with the logits that chose it.
  std::function<void(size_t row, int32_t id, const float* logits, int64_t n)> on_logits;
};

// The rows a verification pass of `target` takes for about the cost of one plain step on the kernels in use
// (SpeculativeOptions::verify_rows = 0): by the instruction set (kernels::active_isa()) and the element type of
// the target's layer weights. A pass of n rows reads the weights once and makes n times the arithmetic, so the
// point where the arithmetic shows comes sooner with narrower FMAs and with weights that take work to widen.
// From one forward pass of n rows over a 40-token cache against one of 1 row (opt-1.3b, 2 threads, Zen 5; AVX2
// through OPT_ISA=avx2; the batch-4 step of bench_generate for f32): AVX-512 bf16 4 rows 1.03-1.14 steps, int8
// 3 rows 0.8-1.0 and 4 rows 1.2, int4 2 rows 1.1 and 3 rows 1.3; AVX2 bf16 2 rows 1.05-1.09 and 3 rows 1.3-1.9,
// int8 2 rows 1.4, int4 2 rows 1.9. Memory that runs slower makes every row cheaper (these were taken at 20-55
// GB/s). AVX2 since, on an AMD Zen 3 (2 threads, 26-30 GB/s, the linear layers of 4 opt-1.3b layers, 15
// alternating rounds): bf16 5 / 6 rows 1.07-1.12 / 1.19-1.22 (a whole pass with its LM head 1.07 / 1.22, 7 rows
// 2.0: a 7th row leaves the one-tile path), f16 6 rows 1.43, f32 4 / 6 rows 1.19 / 1.39, int8 2 / 3 / 4 / 6 rows
// 1.14 / 1.46 / 1.68 / 2.22, int4 2 / 3 / 6 rows 1.36 / 1.96 / 3.0 (measured passes replace the prior as they
// come: there, opt-1.3b bf16 with an int8 self-draft ran 4.6-4.9 tokens a pass under adaptive K with either
// prior, 2 or 5 rows). NEON was not measured (no ARM machine here): an older reading of AVX2's, halved for
// integer weights.
inline double verify_rows_for(const Model& target) {
  const ModelWeights& w = target.weights();
  const dtype t = w.layers.empty() ? w.lm_head().type : w.layers.front().fc1.packed.type;
  const int kind = t == dtype::I4 ? 3 : t == dtype::I8 ? 2 : t == dtype::F32 ? 0 : 1;  // f32, 16-bit, int8, int4
  static constexpr double kAvx512[4] = {3.0, 4.0, 3.0, 2.0}, kAvx2[4] = {4.0, 5.0, 2.5, 2.0},
                          kNeon[4] = {2.0, 2.0, 1.0, 1.0};
  switch (kernels::active_isa()) {
    case kernels::isa::avx512: return kAvx512[kind];
    case kernels::isa::avx2: return kAvx2[kind];
    case kernels::isa::neon: return kNeon[kind];
    default: return 1.0;  // scalar: every row is all arithmetic
  }
}

struct SpeculativeStats {
  int64_t passes = 0;      // model forward passes after the prompt passes
  int64_t proposed = 0;    // draft tokens verified
  int64_t accepted = 0;    // draft tokens kept
  int64_t new_tokens = 0;  // tokens generated (prompt passes' first tokens included)
  // Where the time went, summed over the sequences (in a Batch, each speculating sequence counts the shared pass):
  // in Drafter::propose (its catching up included), and in the passes that verified (from the end of drafting to
  // the verdict: the model pass, and in a Batch everything else of the step)
  double draft_ms = 0.0, pass_ms = 0.0;
  double acceptance() const noexcept { return proposed ? double(accepted) / double(proposed) : 0.0; }
  double tokens_per_pass() const noexcept { return passes ? double(new_tokens) / double(passes) : 0.0; }
  double draft_ms_per_proposal() const noexcept { return proposed ? draft_ms / double(proposed) : 0.0; }
  double ms_per_pass() const noexcept { return passes ? pass_ms / double(passes) : 0.0; }
};

namespace detail {

// K for the next pass, and the pause after passes that accept nothing (SpeculativeOptions::adaptive).
struct DraftLength {
  int64_t max_k, k, misses = 0, pause = 0, backoff = 2;
  bool adaptive;
  // a draft token's cost in plain steps, and the rows a verification takes for one step's (the prior of verify())
  double cost, rows;
  double kept = 0, trials = 0;  // proposals kept, and kept + rejected ones, of the latest passes (decayed)
  static constexpr double kDecay = 0.8;  // each pass weighs 0.8 of the one after it
  // A decayed mean of measured times: each new value weighs 1, the ones before kDecay times what they weighed.
  struct Decayed {
    double sum = 0, weight = 0;
    void add(double v) { sum = kDecay * sum + v, weight = kDecay * weight + 1.0; }
    bool any() const { return weight > 0; }
    double mean() const { return sum / weight; }
  };
  // measured times (observe()): a draft token's ms, and a pass's ms by its rows (index m: passes of m rows,
  // 1 .. max_k + 1)
  Decayed draft_ms;
  std::vector<Decayed> pass_ms;
  // passes timed so far (observe()), and the count at which passes of m rows were last timed (index m)
  int64_t timed = 0;
  std::vector<int64_t> timed_at;
  // passes after which a length's timing is old enough to be taken again, and then replaced (a length priced by
  // one slow pass, the first after the prompt say, would otherwise never be tried again: on Zen 5, opt-1.3b bf16
  // with an int8 self-draft and K <= 8, adaptive K sat at 3 for ~10 passes on a first 5-row pass timed at 1.13
  // steps, where later ones took 1.02)
  static constexpr int64_t kStale = 6;
  DraftLength(int64_t kmax, bool adapt, double draft_cost = 0.0, double verify_rows = 4.0)
      : max_k(kmax), k(std::min<int64_t>(kmax, 4)), adaptive(adapt), cost(std::max(0.0, draft_cost)),
        rows(std::max(1.0, verify_rows)), pass_ms(size_t(std::max<int64_t>(kmax, 0) + 2)),
        timed_at(pass_ms.size(), 0) {}
  int64_t next() {
    if (!adaptive) return max_k;
    if (pause > 0) {
      --pause;
      return 0;
    }
    return k;
  }
  // The estimated chance that a proposal is kept (kept + 1/2) / (trials + 1).
  double acceptance() const { return (kept + 0.5) / (trials + 1.0); }
  // The prior cost of a pass of m rows in plain steps: it reads the weights once, and past `rows` rows its
  // arithmetic shows.
  double prior(int64_t m) const { return std::max(1.0, double(m) / rows); }
  bool measured(int64_t m) const { return m >= 1 && size_t(m) < pass_ms.size() && pass_ms[size_t(m)].any(); }
  bool stale(int64_t m) const { return measured(m) && timed - timed_at[size_t(m)] >= kStale; }
  // A pass of m rows in ms: measured, else from the measured row count nearest below m (else above) by the prior;
  // 0 when no pass was measured.
  double pass_estimate(int64_t m) const {
    if (measured(m)) return pass_ms[size_t(m)].mean();
    const int64_t n = int64_t(pass_ms.size());
    for (int64_t d = 1; d < n; ++d) {
      for (const int64_t m0 : {m - d, m + d})
        if (measured(m0)) return pass_ms[size_t(m0)].mean() * prior(m) / prior(m0);
    }
    return 0.0;
  }
  // A verification of m rows in plain steps: measured passes over the (estimated) 1-row pass where some pass was
  // timed, else the prior.
  double verify(int64_t m) const {
    const double one = pass_estimate(1);
    return one > 0 ? std::max(1.0, pass_estimate(m) / one) : prior(m);
  }
  // Tokens a pass of n proposals yields when each is kept with probability a, per plain step it costs.
  double rate(int64_t n, double a) const {
    const double tokens = a >= 1.0 ? double(n + 1) : (1.0 - std::pow(a, double(n + 1))) / (1.0 - a);
    return tokens / (cost * double(n) + verify(n + 1));
  }
  int64_t best() const {
    const double a = acceptance();
    int64_t b = 1;
    for (int64_t n = 2; n <= max_k; ++n)
      if (rate(n, a) > rate(b, a)) b = n;
    return std::min(b, max_k);
  }
  // What a pass took: the drafter's time for `drafted` proposals (draft_ms_total < 0: not measured, as for a pass
  // whose drafter first caught up with a prompt or a pause), and the model pass of `pass_rows` rows of this
  // sequence (in a Batch, the shared pass). Once both are known, cost is the measured draft token over the
  // (estimated) 1-row pass, in place of the drafter's estimate (an int4 self-draft of opt-6.7b bf16 reads 0.27 of
  // the bytes but its steps took more than that), and verify() uses the measured passes in place of the prior
  // (on the Intel machine, opt-1.3b bf16, passes of 5 / 6 / 8 rows took ~1.04 / 1.09 / 1.33 steps, where the
  // prior for AVX-512 bf16, 4 rows a step, says 1.25 / 1.5 / 2).
  void observe(double draft_ms_total, int64_t drafted, double pass_ms_total, int64_t pass_rows) {
    if (!adaptive || !(pass_ms_total > 0) || pass_rows < 1) return;
    if (size_t(pass_rows) < pass_ms.size()) {
      Decayed& d = pass_ms[size_t(pass_rows)];
      if (stale(pass_rows)) d = Decayed{};  // a stale timing is replaced, not averaged in
      d.add(pass_ms_total);
      timed_at[size_t(pass_rows)] = timed + 1;
    }
    ++timed;
    if (draft_ms_total >= 0 && drafted > 0) draft_ms.add(draft_ms_total / double(drafted));
    const double one = pass_estimate(1);
    if (draft_ms.any() && one > 0) cost = draft_ms.mean() / one;
  }
  void update(int64_t proposed, int64_t accepted) {
    if (!adaptive || proposed == 0) return;
    kept = kDecay * kept + double(accepted);
    trials = kDecay * trials + double(accepted) + (accepted < proposed ? 1.0 : 0.0);
    bool explore = false;
    if (accepted == 0) {
      k = 1, ++misses;
    } else {
      k = best(), misses = 0;
      // a pass that kept every proposal tries one more where a pass of that length was never timed (once timed,
      // verify() knows it), or was last timed kStale passes ago: the prior may price longer passes too high on
      // this machine, and one slow pass may have priced that length
      explore = accepted == proposed && k < max_k && measured(k + 1) && (!measured(k + 2) || stale(k + 2));
    }
    if (misses >= 3) {
      pause = backoff, backoff = std::min<int64_t>(32, backoff * 2), misses = 0;
    } else if (accepted > 0 && rate(k, acceptance()) < 1.0) {
      // drafting that does not pay by the cost model (fewer tokens per step than plain decoding's 1) pauses too
      pause = backoff, backoff = std::min<int64_t>(32, backoff * 2);
    } else if (accepted == proposed) {
      backoff = 2;
      if (explore) ++k;
    }
  }
};

}  // namespace detail

// ---- speculative sampling: the rule for one proposal ------------------------------------------------------------
// p: the target's distribution at the proposal's position; q: the distribution the drafter drew the proposal x
// from, or null for a deterministic proposal (q all on x). Both are probabilities over the vocabulary.

// The probability of keeping x: min(1, p(x) / q(x)); p(x) for a deterministic proposal.
inline double draft_acceptance(const std::vector<double>& p, const std::vector<double>* q, int32_t x) {
  if (x < 0 || size_t(x) >= p.size())
    throw input_error("draft_acceptance: proposal " + std::to_string(x) + " outside [0, " + std::to_string(p.size()) +
                      ")");
  if (q && q->size() != p.size())
    throw input_error("draft_acceptance: q has " + std::to_string(q->size()) + " entries, expected p's " +
                      std::to_string(p.size()));
  const double px = p[size_t(x)], qx = q ? (*q)[size_t(x)] : 1.0;
  if (px <= 0) return 0.0;
  return qx <= px ? 1.0 : px / qx;
}

// What replaces a rejected x: max(0, p - q) normalized (for a deterministic proposal: p without x, normalized).
// When nothing is left (x could not have been rejected), p itself.
inline void draft_residual(const std::vector<double>& p, const std::vector<double>* q, int32_t x,
                           std::vector<double>& out) {
  draft_acceptance(p, q, x);  // checks x and q
  out.resize(p.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double qi = q ? (*q)[i] : (i == size_t(x) ? 1.0 : 0.0);
    out[i] = std::max(0.0, p[i] - qi);
    sum += out[i];
  }
  if (!(sum > 0)) {
    out = p;
    return;
  }
  for (double& v : out) v /= sum;
}

struct DraftVerdict {
  int32_t token = 0;      // x when accepted, else the replacement
  bool accepted = false;
};

// Speculative sampling's step for proposal x with two uniform numbers in [0, 1): kept when u < draft_acceptance,
// else the replacement is Sampler::draw(draft_residual, v). Over u and v (and x ~ q), the token is distributed
// as p. `scratch` holds the residual.
inline DraftVerdict judge_draft(const std::vector<double>& p, const std::vector<double>* q, int32_t x, double u,
                                double v, std::vector<double>& scratch) {
  if (u < draft_acceptance(p, q, x)) return {x, true};
  draft_residual(p, q, x, scratch);
  return {Sampler::draw(scratch, v), false};
}

// ---- speculation inside opt::Batch ------------------------------------------------------------------------------

namespace detail {

// One sequence's speculation: its drafter, its draft length, and THE verification of a pass (every speculating
// caller, Batch::step and through it speculative_generate_ids, runs this loop).
class SpeculativeSequence final : public Speculation::Sequence {
 public:
  SpeculativeSequence(std::shared_ptr<Drafter> d, const SpeculativeOptions& so, double draft_cost,
                      double verify_rows, SpeculativeStats* stats)
      : d_(std::move(d)), dl_(so.draft_tokens, so.adaptive, draft_cost, verify_rows), stats_(stats) {}

  void draft(const std::vector<int32_t>& tokens, int64_t room, int64_t vocab, std::vector<int32_t>& out) override {
    drafted_ = true;
    out.clear();
    const int64_t k = std::min(dl_.next(), room);
    const clock::time_point t0 = clock::now();
    drafted_at_ = t0;
    draft_ms_ = -1.0;
    if (k <= 0) {
      caught_up_ = false;  // the drafter falls behind while it pauses
      return;
    }
    out = d_->propose(tokens, k);
    drafted_at_ = clock::now();
    const double ms = std::chrono::duration<double, std::milli>(drafted_at_ - t0).count();
    if (stats_) stats_->draft_ms += ms;
    // (the first proposals after the prompt or a pause include the drafter's catching up: not a draft's cost)
    if (caught_up_) draft_ms_ = ms;
    caught_up_ = true;
    if (int64_t(out.size()) > k) out.resize(size_t(k));
    for (size_t j = 0; j < out.size(); ++j) {
      const std::vector<double>* q = d_->draft_distribution(j);
      // beyond the vocabulary cannot match; a q that does not cover the vocabulary is not used
      if (out[j] < 0 || out[j] >= vocab || (q && int64_t(q->size()) != vocab)) out.resize(j);
    }
  }

  int64_t verify(const float* rows, int64_t cols, const std::vector<int32_t>& draft, Sampler& sampler,
                 const std::vector<int32_t>& tokens, const std::function<bool(int32_t, const float*)>& take) override {
    const double pass_ms = std::chrono::duration<double, std::milli>(clock::now() - drafted_at_).count();
    const bool greedy = sampler.options().greedy();
    const int64_t nd = int64_t(draft.size());
    int64_t kept = 0, emitted = 0;
    for (int64_t j = 0; j <= nd; ++j) {
      const float* l = rows + j * cols;
      DraftVerdict v;
      if (j == nd) {  // every proposal kept (or none made): the model's own next token
        v.token = sampler.sample(l, cols, tokens);
      } else if (greedy) {  // the plain step's token; the proposal is kept when it is that token
        v.token = sampler.sample(l, cols, tokens);
        v.accepted = v.token == draft[size_t(j)];
      } else {
        const std::vector<double>& p = sampler.distribution(l, cols, tokens);
        const double u = sampler.uniform(), r = sampler.uniform();
        v = judge_draft(p, d_->draft_distribution(size_t(j)), draft[size_t(j)], u, r, residual_);
      }
      ++emitted;
      const bool more = take(v.token, l);  // row j + 1 follows from the right context only if draft[j] was kept
      if (v.accepted) ++kept;
      if (!more || !v.accepted) break;
    }
    if (stats_) {
      stats_->passes += drafted_;
      stats_->proposed += nd;
      stats_->accepted += kept;
      stats_->new_tokens += emitted;
      if (drafted_) stats_->pass_ms += pass_ms;
    }
    if (drafted_) {
      // (timed costs only for greedy sequences, whose output K cannot change: a seeded sampling run draws the same
      // numbers only if its K follow the same schedule, from the drafter's estimate)
      if (greedy) dl_.observe(draft_ms_, nd, pass_ms, nd + 1);
      dl_.update(nd, kept);
    }
    drafted_ = false;
    return kept;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::shared_ptr<Drafter> d_;
  DraftLength dl_;
  SpeculativeStats* stats_;
  bool drafted_ = false;  // this pass is a decode step that drafted (not a prompt pass)
  bool caught_up_ = false;  // the drafter proposed in the previous decode step (it has seen the sequence)
  clock::time_point drafted_at_{};  // when draft() returned: the model pass runs from there to verify()
  double draft_ms_ = -1.0;          // propose()'s time this pass; < 0: not a draft's cost (see draft())
  std::vector<double> residual_;
};

class SpeculativeDecoding final : public Speculation {
 public:
  SpeculativeDecoding(std::shared_ptr<Drafter> d, const SpeculativeOptions& so, SpeculativeStats* stats)
      : d_(std::move(d)), so_(so), stats_(stats) {}
  std::unique_ptr<Sequence> start(const Model& target) const override {
    std::shared_ptr<Drafter> d = d_->fork();
    const double cost = so_.draft_cost >= 0 ? so_.draft_cost : d_->token_cost(target);
    const double rows = so_.verify_rows > 0 ? so_.verify_rows : verify_rows_for(target);
    return std::make_unique<SpeculativeSequence>(d ? d : d_, so_, cost, rows, stats_);
  }

 private:
  std::shared_ptr<Drafter> d_;
  SpeculativeOptions so_;
  SpeculativeStats* stats_;
};

}  // namespace detail

// Speculative decoding for the sequences of an opt::Batch: set SequenceOptions::speculation to this. Each sequence
// drafts with its own drafter->fork() (or shares `drafter` when fork() gives null). `stats`, when given, adds up
// every such sequence's passes (it must outlive them). SpeculativeOptions::on_logits is not used here (StepToken
// has the logits). Throws input_error for draft_tokens outside 0..64 or no drafter.
inline std::shared_ptr<const Speculation> speculation(std::shared_ptr<Drafter> drafter,
                                                      const SpeculativeOptions& so = {},
                                                      SpeculativeStats* stats = nullptr) {
  if (!drafter) throw input_error("speculative decoding: no drafter");
  if (so.draft_tokens < 0 || so.draft_tokens > 64)
    throw input_error("speculative decoding: draft_tokens = " + std::to_string(so.draft_tokens) +
                      ", expected 0..64");
  if (!(so.verify_rows == 0.0 || so.verify_rows >= 1.0) || !std::isfinite(so.verify_rows))
    throw input_error("speculative decoding: verify_rows = " + std::to_string(so.verify_rows) +
                      ", expected 0 (by the kernels and the weights) or >= 1");
  if (std::isnan(so.draft_cost) || std::isinf(so.draft_cost))
    throw input_error("speculative decoding: draft_cost = " + std::to_string(so.draft_cost) +
                      ", expected a finite number (< 0: the drafter's estimate)");
  return std::make_shared<detail::SpeculativeDecoding>(std::move(drafter), so, stats);
}

// Generation of every prompt with speculative decoding, on an opt::Batch: for greedy options the same
// GenerateResult as generate_ids (same sequences, new tokens, first logits and finish reasons, bit for bit), with
// the drafter's proposals verified K at a time; with sampling, plain sampling's distribution (not its draws), the
// same output for the same seed. The rows share each pass (each row drafts with its own drafter.fork(), or with
// `drafter`). GenerateOptions::on_token works as in generate_ids.
inline GenerateResult speculative_generate_ids(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                               const GenerateOptions& opts, Drafter& drafter,
                                               const SpeculativeOptions& so, Workspace& ws,
                                               bool keep_first_logits = false, SpeculativeStats* stats = nullptr) {
  const Config& c = model.config();
  opts.sampling.validate();
  detail::check_generate(model, prompts, opts);
  SpeculativeStats st;
  SequenceOptions sq = detail::sequence_options(opts);
  sq.speculation = speculation(std::shared_ptr<Drafter>(&drafter, [](Drafter*) {}), so, &st);  // not owned
  Batch batch(model, ws);
  batch.set_max_cache_bytes(opts.max_cache_bytes);
  std::vector<SeqId> ids(prompts.size());
  std::map<SeqId, size_t> row_of;
  for (size_t b = 0; b < prompts.size(); ++b) row_of[ids[b] = batch.add(prompts[b], sq)] = b;
  GenerateResult res;
  if (keep_first_logits) res.first_logits.assign(prompts.size(), {});
  std::vector<bool> any(prompts.size(), false);
  while (!batch.empty()) {
    batch.step([&](const StepToken& t) {
      const size_t b = row_of[t.seq];
      if (keep_first_logits && !any[b]) res.first_logits[b].assign(t.logits, t.logits + c.vocab_size);
      any[b] = true;
      if (so.on_logits) so.on_logits(b, t.token, t.logits, c.vocab_size);
      return !opts.on_token || opts.on_token(b, t.token);
    });
  }
  for (size_t b = 0; b < prompts.size(); ++b) {
    res.sequences.push_back(batch.tokens(ids[b]));
    res.new_tokens.push_back(batch.new_tokens(ids[b]));
    res.finish_reasons.push_back(batch.finish_reason(ids[b]));
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
