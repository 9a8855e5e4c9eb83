// opt-serve's scheduler: the one thread that owns the model's opt::Batch. HTTP threads submit requests (their
// choices queue up); between two steps the scheduler admits waiting sequences (up to --max-batch running), drops
// those whose client went away (Batch::stop frees the KV cache at once), runs one step for all of them, and hands
// each new token to its request's TextStream (streaming detokenizer + stop strings). With a drafter (--lookup,
// --draft-self, --draft) every sequence that does not opt out speculates inside that step (opt::speculation).
// With --cache-bytes the batch has an opt::PrefixCache: prompts start from the KV of their longest cached prefix.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opt/batch.hpp>
#include <opt/generate.hpp>
#include <opt/logprobs.hpp>
#include <opt/model.hpp>
#include <opt/prefix_cache.hpp>
#include <opt/speculative.hpp>
#include <opt/tokenizer.hpp>
#include <string>
#include <thread>
#include <vector>

#include "metrics.hpp"
#include "options.hpp"
#include "request.hpp"

namespace opt_serve {

// ---- requests and the scheduler ------------------------------------------------------------------------------------

class Scheduler {
 public:
  // `drafter`: speculative decoding for every sequence that does not opt out (null: none).
  Scheduler(const opt::Model& model, const opt::Tokenizer& tok, const ServerOptions& o,
            std::shared_ptr<opt::Drafter> drafter = nullptr, std::string drafter_name = {})
      : tok_(tok), opts_(o), batch_(model, o.threads), kv_cache_(opt::kv_cache_type_from_string(o.kv_cache)),
        drafter_name_(std::move(drafter_name)) {
    dopts_.skip_special_tokens = true;
    // clean_up_tokenization_spaces: the tokenizer's default, as batch_decode
    if (drafter) {
      opt::SpeculativeOptions so;
      so.draft_tokens = o.spec.draft_tokens;
      so.verify_rows = o.spec.verify_rows;
      spec_ = opt::speculation(std::move(drafter), so, &spec_stats_);
    }
    if (o.cache_bytes > 0) {
      prefix_ = std::make_shared<opt::PrefixCache>(model, o.cache_bytes, o.cache_block_tokens);
      batch_.set_prefix_cache(prefix_);
    }
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  // Stops the loop: every request still running or waiting fails with "server shutting down".
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Draining (SIGTERM with --drain-timeout): no new request is queued; those running and waiting go on.
  void begin_drain() {
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
  }
  bool draining() const {
    std::lock_guard<std::mutex> lk(mu_);
    return draining_;
  }
  // Choices queued or running: submitted and not yet finished (0: a drain is over).
  size_t outstanding() const { return outstanding_.load(); }

  // Queues every choice of a request; false when the queue has no room for all of them, or the server is
  // stopping or draining (nothing is queued).
  bool submit(const std::shared_ptr<Request>& r) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_ || draining_) return false;
      if (pending_.size() + r->choices.size() > opts_.max_queue + free_slots_locked()) return false;
      r->remaining = r->choices.size();
      outstanding_ += r->choices.size();
      for (size_t i = 0; i < r->choices.size(); ++i) {
        r->choices[i].stream = std::make_unique<opt::TextStream>(tok_, r->choices[i].stop, dopts_);
        pending_.push_back({r, i});
      }
      queued_ = pending_.size();
    }
    cv_.notify_all();
    return true;
  }

  void wake() { cv_.notify_all(); }
  bool stopping() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stopping_;
  }

  json stats() const {
    return {{"active", active_count_.load()},     {"queued", queued_.load()},
            {"max_batch", opts_.max_batch},       {"max_queue", opts_.max_queue},
            {"completed", completed_.load()},     {"cancelled", cancelled_.load()},
            {"steps", steps_.load()},             {"generated_tokens", generated_.load()},
            {"kv_cache_bytes", cache_bytes_.load()}};
  }
  // {"drafter", "proposed", "accepted", "passes"} when the server speculates; null otherwise.
  json speculation_stats() const {
    if (!spec_) return nullptr;
    return {{"drafter", drafter_name_}, {"proposed", proposed_.load()}, {"accepted", accepted_.load()},
            {"passes", passes_.load()}};
  }

  // {"hits", "misses", "hit_tokens", "stored_blocks", "evictions", "bytes", "blocks", "budget", "block_tokens"}
  // with a prefix cache; null otherwise. (PrefixCache is thread-safe: read from any thread.)
  json prefix_cache_stats() const {
    if (!prefix_) return nullptr;
    const opt::PrefixCacheStats s = prefix_->stats();
    return {{"hits", s.hits},         {"misses", s.misses}, {"hit_tokens", s.hit_tokens},
            {"stored_blocks", s.stored_blocks}, {"evictions", s.evictions}, {"bytes", s.bytes},
            {"blocks", s.blocks},     {"budget", s.budget}, {"block_tokens", s.block_tokens}};
  }

  const opt::DecodeOptions& decode_options() const { return dopts_; }
  const Histogram& step_seconds() const { return step_seconds_; }  // each step's time (GET /metrics)

 private:
  struct Entry {
    std::shared_ptr<Request> req;
    size_t choice;
  };

  size_t free_slots_locked() const { return opts_.max_batch - std::min(opts_.max_batch, active_count_.load()); }

  void run() {
    for (;;) {
      std::vector<Entry> admitted;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !pending_.empty() || !active_.empty(); });
        if (stopping_) break;
        while (!pending_.empty() && active_.size() + admitted.size() < opts_.max_batch) {
          admitted.push_back(pending_.front());
          pending_.pop_front();
        }
        queued_ = pending_.size();
      }
      for (Entry& e : admitted) admit(e);
      drop_cancelled();
      if (active_.empty()) continue;
      const auto t0 = std::chrono::steady_clock::now();
      step();
      step_seconds_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (opts_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts_.step_delay_ms));
    }
    // shutting down: fail whatever is left
    std::deque<Entry> left;
    {
      std::lock_guard<std::mutex> lk(mu_);
      left.swap(pending_);
      queued_ = 0;
    }
    for (auto& [id, e] : active_) left.push_back(e);
    for (Entry& e : left) fail(e, "server shutting down");
    active_.clear();
    active_count_ = 0;
  }

  void admit(const Entry& e) {
    Choice& c = e.req->choices[e.choice];
    if (e.req->cancelled) {
      finish(e, nullptr, "cancelled");
      ++cancelled_;
      return;
    }
    opt::SeqId id = 0;
    try {
      opt::SequenceOptions so = c.opts;
      so.kv_cache = kv_cache_;
      if (c.speculative) so.speculation = spec_;
      if (c.echo_logprobs) add_prompt_logprobs(*e.req, c);
      id = batch_.add(c.prompt, so);
    } catch (const std::exception& ex) {  // validated before; should not happen
      fail(e, ex.what());
      return;
    }
    if (batch_.finished(id)) {  // max_new_tokens = 0
      finish(e, &id, "length");
      batch_.release(id);
      return;
    }
    active_.emplace(id, e);
    active_count_ = active_.size();
  }

  // echo with logprobs: the prompt's own log-probabilities, from a pass over the prompt of its own (the batch's
  // prefill computes only the last position's logits); the n choices of a prompt share one pass.
  void add_prompt_logprobs(Request& r, Choice& c) {
    {
      std::lock_guard<std::mutex> lk(r.m);
      for (const Choice& o : r.choices)
        if (&o != &c && !o.prompt_lp.empty() && o.logprobs == c.logprobs && o.prompt == c.prompt) {
          c.prompt_lp = o.prompt_lp;
          return;
        }
    }
    auto lp = opt::prompt_logprobs(batch_.model(), c.prompt, c.logprobs, batch_.workspace(), kv_cache_);
    std::lock_guard<std::mutex> lk(r.m);
    c.prompt_lp = std::move(lp);
  }

  void drop_cancelled() {
    for (auto it = active_.begin(); it != active_.end();) {
      if (it->second.req->cancelled) {
        batch_.stop(it->first);  // frees the KV cache now
        finish(it->second, nullptr, "cancelled");
        batch_.release(it->first);
        ++cancelled_;
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    active_count_ = active_.size();
    cache_bytes_ = batch_.cache_bytes();
  }

  void step() {
    // each new token as the batch accepts it (a speculating sequence may get several in a step): to its stream;
    // false stops the sequence there (a stop string)
    std::vector<std::pair<opt::SeqId, std::string>> done;  // finished this step, with their finish reason
    const int64_t vocab = batch_.model().config().vocab_size;
    auto on_token = [&](const opt::StepToken& st) {
      Entry& e = active_.at(st.seq);
      Choice& c = e.req->choices[e.choice];
      ++generated_;
      std::string piece = c.stream->push(st.token);
      bool finished = st.finished, more = true;
      std::string reason = st.reason == opt::FinishReason::length ? "length" : "stop";
      if (!finished && c.stream->stopped()) {  // a stop string: the text ends before it
        more = false;
        finished = true;
        reason = "stop";
      }
      if (finished) piece += c.stream->finish();
      TokenLogprobs tl;  // (logprobs: of the logits that chose the token, the model's raw distribution)
      tl.lp.token = st.token;
      tl.lp.logprob = std::numeric_limits<double>::quiet_NaN();  // (null; step() always gives the logits)
      if (c.logprobs >= 0 && st.logits) tl.lp = opt::logprobs(st.logits, vocab, st.token, c.logprobs);
      {
        std::lock_guard<std::mutex> lk(e.req->m);
        if (c.logprobs >= 0) {  // the piece goes with the token's logprobs, every token its own event
          tl.text_offset = c.lp.empty() ? c.echo_chars : c.lp.back().text_offset + code_points(c.lp.back().piece);
          tl.piece = piece;
          c.lp.push_back(std::move(tl));
        } else if (!piece.empty()) {
          c.out.push_back(piece);
        }
        c.completion += piece;
        if (c.completion_tokens == 0) c.first_token_at = std::chrono::steady_clock::now();
        ++c.completion_tokens;
      }
      if (finished) done.emplace_back(st.seq, reason);
      else if (!piece.empty() || c.logprobs >= 0) e.req->notify();
      return more;
    };
    try {
      batch_.step(on_token);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "opt-serve: step failed: %s\n", ex.what());
      for (auto& [id, e] : active_) {
        fail(e, std::string("internal error: ") + ex.what());
        batch_.release(id);
      }
      active_.clear();
      active_count_ = 0;
      return;
    }
    ++steps_;
    // the counters first: a client that reads GET /health after its answer sees its sequence gone
    active_count_ = active_.size() - done.size();
    for (auto& [id, reason] : done) {
      finish(active_.at(id), &id, reason);
      batch_.release(id);
      active_.erase(id);
    }
    active_count_ = active_.size();
    cache_bytes_ = batch_.cache_bytes();
    proposed_ = size_t(spec_stats_.proposed);
    accepted_ = size_t(spec_stats_.accepted);
    passes_ = size_t(spec_stats_.passes);
  }

  // Marks a choice done; `id` (when given) is its sequence in the batch, for its tokens.
  void finish(const Entry& e, const opt::SeqId* id, const std::string& reason) {
    Choice& c = e.req->choices[e.choice];
    {
      std::lock_guard<std::mutex> lk(e.req->m);
      c.done = true;
      c.finish_reason = reason;
      c.tokens = id ? batch_.tokens(*id) : c.prompt;
      --e.req->remaining;
    }
    if (reason != "cancelled") ++completed_;
    --outstanding_;
    e.req->notify();
  }

  void fail(const Entry& e, const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(e.req->m);
      if (e.req->failure.empty()) e.req->failure = why;
    }
    finish(e, nullptr, "error");
  }

  opt::Tokenizer tok_;
  const ServerOptions& opts_;
  opt::DecodeOptions dopts_;
  opt::Batch batch_;  // the scheduler thread's alone
  opt::dtype kv_cache_;  // every sequence's KV cache element type
  std::shared_ptr<const opt::Speculation> spec_;  // null: plain decoding
  std::shared_ptr<opt::PrefixCache> prefix_;      // null: no prefix cache (--cache-bytes 0)
  opt::SpeculativeStats spec_stats_;              // the scheduler thread's; copied to the atomics after each step
  std::string drafter_name_;
  std::map<opt::SeqId, Entry> active_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  bool stopping_ = false, draining_ = false;
  std::thread thread_;

  std::atomic<size_t> active_count_{0}, queued_{0}, completed_{0}, cancelled_{0}, steps_{0}, generated_{0},
      cache_bytes_{0}, proposed_{0}, accepted_{0}, passes_{0}, outstanding_{0};
  Histogram step_seconds_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
};

}  // namespace opt_serve
