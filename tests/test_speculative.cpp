// Speculative decoding gives plain greedy decoding's output exactly: on every fixture's generation cases, with
// each drafter (prompt lookup, the model's own int8 weights, another model, one that is always right, one that is
// always wrong) and K in {1, 2, 4, 7}, the new ids equal transformers' goldens and the logits that chose each token
// equal plain decoding's bit for bit (speculative_generate_ids runs every row in one opt::Batch). Inside a Batch
// with continuous batching, speculating and plain sequences joining at different steps each get their plain run.
// Speculative sampling keeps the distribution: the acceptance rule on hand-made p and q, and the first tokens'
// joint distribution over thousands of seeds against the exact one the model gives.
#include <opt/speculative.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "shared.hpp"

using json = nlohmann::json;

namespace {

struct Plain {
  std::vector<std::vector<int32_t>> tokens;               // per row: new tokens
  std::vector<std::vector<std::vector<float>>> logits;   // per row, per new token: the logits that chose it
};

// Plain greedy decoding, one step at a time, each row alone.
Plain plain(const opt::Model& m, const std::vector<std::vector<int32_t>>& rows, int64_t max_new) {
  Plain out;
  opt::Workspace ws(1);
  const int64_t V = m.config().vocab_size, eos = m.config().eos_token_id;
  for (const auto& r : rows) {
    opt::KvCache kv(m.config());
    std::vector<int32_t> toks;
    std::vector<std::vector<float>> lg;
    opt::LogitsView lv = m.forward({{&kv, r.data(), int64_t(r.size())}}, ws);
    while (true) {
      const int32_t id = opt::argmax(lv.row(0), V);
      toks.push_back(id);
      lg.emplace_back(lv.row(0), lv.row(0) + V);
      if (id == eos || int64_t(toks.size()) == max_new) break;
      lv = m.forward({{&kv, &toks.back(), 1}}, ws);
    }
    out.tokens.push_back(toks);
    out.logits.push_back(lg);
  }
  return out;
}

// Proposes the plain continuation (always right) or something else (always wrong).
class ScriptedDrafter : public opt::Drafter {
 public:
  ScriptedDrafter(const Plain& p, const std::vector<std::vector<int32_t>>& rows, bool right, int64_t vocab)
      : p_(p), rows_(rows), right_(right), vocab_(vocab) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    for (size_t b = 0; b < rows_.size(); ++b) {
      const auto& r = rows_[b];
      // the row whose prompt and plain tokens so far are t (prompts of a batch may be prefixes of each other)
      if (t.size() < r.size() || t.size() - r.size() > p_.tokens[b].size()) continue;
      const size_t done = t.size() - r.size();
      if (!std::equal(r.begin(), r.end(), t.begin()) ||
          !std::equal(p_.tokens[b].begin(), p_.tokens[b].begin() + long(done), t.begin() + long(r.size())))
        continue;
      std::vector<int32_t> out;
      for (size_t j = done; j < p_.tokens[b].size() && int64_t(out.size()) < k; ++j)
        out.push_back(right_ ? p_.tokens[b][j] : int32_t((p_.tokens[b][j] + 1) % vocab_));
      if (!right_ && out.empty()) out.push_back(0);
      return out;
    }
    return {};
  }

 private:
  const Plain& p_;
  const std::vector<std::vector<int32_t>>& rows_;
  bool right_;
  int64_t vocab_;
};

}  // namespace

TEST_CASE("prompt lookup proposes what followed the latest earlier occurrence of the last n-gram") {
  opt::PromptLookupDrafter d(3);
  CHECK(d.propose({1, 2, 3, 1, 2}, 3) == std::vector<int32_t>{3, 1, 2});
  CHECK(d.propose({1, 2, 3, 1, 2}, 1) == std::vector<int32_t>{3});
  CHECK(d.propose({5, 1, 2, 9, 7, 1, 2, 8, 1, 2}, 2) == std::vector<int32_t>{8, 1});  // the latest one
  CHECK(d.propose({4, 5, 6}, 4).empty());
  CHECK(d.propose({4}, 4).empty());
  CHECK_THROWS_AS(opt::PromptLookupDrafter(0), opt::input_error);
}

TEST_CASE("speculative greedy == plain greedy, token for token and logit for logit, for every drafter and K") {
  struct Fixture {
    const char* name;
    const char* draft;  // another fixture with the same vocabulary, or null
  };
  const Fixture fixtures[] = {{"opt-tiny-preln", "opt-tiny-preln-bf16"}, {"opt-tiny-odd", nullptr},
                              {"opt-tiny-postln-proj", nullptr}, {"opt-tiny-nofinalln-silu", nullptr},
                              {"opt-tiny-gelu-nobias", nullptr}};
  size_t cases = 0;
  for (const Fixture& f : fixtures) {
    INFO(std::string(f.name));
    const auto dir = opt_test::fixture_dir(f.name);
    const opt::Model m = opt::Model::load(dir);
    opt::LoadOptions q8;
    q8.quantize = opt::quantization::int8;
    const opt::Model self8 = opt::Model::load(dir, q8);
    q8.approximate_int8 = true;  // its drafts on the CPU's int8 dot products: other proposals, the same output
    const opt::Model self8a = opt::Model::load(dir, q8);
    const json gold = opt_test::read_json(dir / "goldens.json");
    for (const json& cs : gold.at("cases")) {
      if (!cs.contains("generate")) continue;
      INFO(cs.at("name").get<std::string>());
      const json& g = cs.at("generate");
      const auto rows = cs.at("prompts").get<std::vector<std::vector<int32_t>>>();
      const int64_t max_new = g.at("max_new_tokens");
      const Plain p = plain(m, rows, max_new);
      for (size_t b = 0; b < rows.size(); ++b) {
        const auto want = g.contains("alone") ? g["alone"][b]["new_tokens"].get<std::vector<int32_t>>()
                                              : g.at("new_tokens")[b].get<std::vector<int32_t>>();
        REQUIRE(p.tokens[b] == want);  // the plain loop is the goldens' (test_model checks it too)
      }
      std::vector<std::unique_ptr<opt::Drafter>> drafters;
      std::vector<std::string> names;
      drafters.push_back(std::make_unique<opt::PromptLookupDrafter>(2)), names.push_back("lookup");
      drafters.push_back(std::make_unique<opt::ModelDrafter>(self8, 1)), names.push_back("self int8");
      drafters.push_back(std::make_unique<opt::ModelDrafter>(self8a, 1)), names.push_back("self int8 approximate");
      if (f.draft) {
        drafters.push_back(std::make_unique<opt::ModelDrafter>(opt::Model::load(opt_test::fixture_dir(f.draft)), 1));
        names.push_back(f.draft);
      }
      drafters.push_back(std::make_unique<ScriptedDrafter>(p, rows, true, m.config().vocab_size));
      names.push_back("always right");
      drafters.push_back(std::make_unique<ScriptedDrafter>(p, rows, false, m.config().vocab_size));
      names.push_back("always wrong");
      for (size_t d = 0; d < drafters.size(); ++d)
        for (int64_t k : {1, 2, 4, 7})
          for (bool adaptive : {false, true}) {
            const std::string label = names[d] + " K=" + std::to_string(k) + (adaptive ? " adaptive" : "");
            INFO(label);
            opt::SpeculativeOptions so;
            so.draft_tokens = k;
            so.adaptive = adaptive;
            std::vector<std::vector<std::vector<float>>> got(rows.size());
            so.on_logits = [&](size_t row, int32_t, const float* l, int64_t n) { got[row].emplace_back(l, l + n); };
            opt::GenerateOptions go;
            go.max_new_tokens = max_new;
            opt::Workspace ws(2);
            opt::SpeculativeStats st;
            const opt::GenerateResult r =
                opt::speculative_generate_ids(m, rows, go, *drafters[d], so, ws, true, &st);
            for (size_t b = 0; b < rows.size(); ++b) {
              CHECK(r.new_tokens[b] == p.tokens[b]);
              CHECK(got[b] == p.logits[b]);  // bit for bit
              REQUIRE(!p.logits[b].empty());
              CHECK(r.first_logits[b] == p.logits[b][0]);
              std::vector<int32_t> seq = rows[b];
              seq.insert(seq.end(), p.tokens[b].begin(), p.tokens[b].end());
              CHECK(r.sequences[b] == seq);
            }
            CHECK(st.accepted <= st.proposed);
            // the time split: every pass that verified was timed; no proposals, no time a proposal
            CHECK(st.pass_ms >= 0.0);
            CHECK(st.draft_ms >= 0.0);
            if (st.passes > 0) CHECK(st.pass_ms > 0.0);
            CHECK(st.ms_per_pass() == (st.passes ? st.pass_ms / double(st.passes) : 0.0));
            if (st.proposed == 0) CHECK(st.draft_ms_per_proposal() == 0.0);
            if (names[d] == "self int8" && st.proposed > 0) CHECK(st.draft_ms > 0.0);  // a model's forward passes
            if (names[d] == "always wrong") CHECK(st.accepted == 0);
            if (names[d] == "always right") {
              CHECK(st.accepted == st.proposed);
              // every pass but the prompt's gives 1 + the proposals: fewer passes than tokens once K > 1
              if (k > 1 && st.new_tokens > 4) CHECK(st.passes < st.new_tokens - int64_t(rows.size()));
            }
            ++cases;
          }
    }
  }
  MESSAGE(cases << " (fixture case, drafter, K, adaptive) runs");
  CHECK(cases > 400);
}

TEST_CASE("adaptive K: starts at min(K, 4), then the length the cost model prefers; 1 after empty passes, then pauses") {
  // 40 passes over a stream of proposals of which every m-th is wrong (m 0: none); the K of the last 12 passes
  const auto run = [](int64_t kmax, double cost, double rows, int64_t m = 0) {
    opt::detail::DraftLength dl(kmax, true, cost, rows);
    std::vector<int64_t> ks;
    for (int64_t i = 0, g = 0; i < 40; ++i) {
      const int64_t k = dl.next();
      int64_t kept = 0;
      for (; kept < k && !(m > 0 && g % m == m - 1); ++kept) ++g;
      if (kept < k) ++g;  // the rejected proposal
      dl.update(k, kept);
      if (i >= 28) ks.push_back(dl.next());
    }
    return ks;
  };
  const auto all = [](const std::vector<int64_t>& ks, int64_t lo, int64_t hi) {
    return std::all_of(ks.begin(), ks.end(), [&](int64_t k) { return k >= lo && k <= hi; });
  };
  opt::detail::DraftLength first(16, true, 0.0, 4.0);
  CHECK(first.next() == 4);
  // always right, free drafts: K + 1 fills the rows one step verifies (8 rows for 2 steps is no better than 4 for 1)
  CHECK(all(run(16, 0.0, 4.0), 3, 3));
  CHECK(all(run(16, 0.0, 8.0), 7, 7));
  CHECK(all(run(16, 0.0, 100.0), 16, 16));  // verification never dearer than a step: as many as allowed
  CHECK(all(run(6, 0.0, 100.0), 6, 6));
  CHECK(all(run(16, 0.0, 8.0, 20), 7, 7));  // 1 in 20 wrong: still the whole step
  // drafts at half a step, 1 in 10 wrong: short passes (9-row passes, ~1.9 steps on Zen 5, were slower than plain
  // decoding), 1 after a pass whose first proposal was wrong
  CHECK(all(run(8, 0.5, 4.0, 10), 1, 3));
  // drafts as dear as the target's steps, 1 in 2 wrong: K 1 makes 0.75 tokens a step, worse than plain decoding,
  // so drafting pauses between passes of K 1
  {
    const std::vector<int64_t> ks = run(8, 1.0, 4.0, 2);
    CHECK(all(ks, 0, 1));
    CHECK(std::count(ks.begin(), ks.end(), 0) >= 8);
  }
  // drafts at 0.3 of a step, 1 in 2 wrong: K 1 pays (1.5 tokens for 1.3 steps), no pauses
  CHECK(all(run(8, 0.3, 4.0, 2), 1, 2));
  // measured times replace the drafter's estimate: drafts estimated free but timed at a whole step (2-row passes
  // at one step each), half of them wrong, pause as above
  {
    opt::detail::DraftLength dl(8, true, 0.0, 4.0);
    int64_t zeros = 0;
    for (int i = 0; i < 40; ++i) {
      const int64_t k = dl.next();
      zeros += k == 0;
      dl.observe(k > 0 ? 10.0 * double(k) : -1.0, k, 10.0, k + 1);
      dl.update(k, k > 0 ? (i % 2 ? k : 0) : 0);
    }
    CHECK(dl.cost == doctest::Approx(1.0));
    CHECK(zeros >= 10);
    opt::detail::DraftLength cheap(8, true, 1.0, 4.0);  // estimated dear, timed at a tenth of a step
    cheap.observe(1.0, 1, 10.0, 2);
    CHECK(cheap.cost == doctest::Approx(0.1));
    // an unmeasured draft: only the pass counts, timed for its own length (the 1-row pass is still the 2-row
    // one's, the nearest timed)
    cheap.observe(-1.0, 1, 30.0, 8);
    CHECK(cheap.cost == doctest::Approx(0.1));
    CHECK(cheap.verify(8) == doctest::Approx(3.0));
    CHECK(cheap.verify(5) == doctest::Approx(1.25));  // untimed: the 2-row pass's time by the prior (5 / 4 rows)
    CHECK(cheap.verify(9) == doctest::Approx(3.0 * (9.0 / 8.0)));  // beyond: the 8-row pass's by the prior
  }
  // timed passes replace the prior: passes of m rows timed as on the Intel machine (opt-1.3b bf16, 2 threads:
  // 5 / 6 / 7 / 8 rows 1.04 / 1.09 / 1.25 / 1.33 steps), drafts at 0.63 of a step, every proposal kept. The prior
  // alone (4 rows a step) stops at K 3; timed, K climbs to the best length, 4 or 5
  {
    const auto steps = [](int64_t m) {
      static const double t[] = {0, 1.0, 1.0, 1.02, 1.05, 1.04, 1.09, 1.25, 1.33, 1.62};
      return m < 10 ? t[m] : 0.2 * double(m);
    };
    const auto run = [&](bool timed) {
      opt::detail::DraftLength dl(8, true, 0.63, 4.0);
      std::vector<int64_t> ks;
      for (int i = 0; i < 30; ++i) {
        const int64_t k = dl.next();
        ks.push_back(k);
        if (timed) dl.observe(6.3 * double(k), k, 10.0 * steps(k + 1), k + 1);
        dl.update(k, k);
      }
      return ks;
    };
    const std::vector<int64_t> prior = run(false), timed = run(true);
    // (the first passes, with few proposals seen, estimate the acceptance low and take shorter passes)
    CHECK(std::all_of(prior.begin() + 2, prior.end(), [](int64_t k) { return k == 3; }));
    CHECK(std::all_of(timed.begin() + 8, timed.end(), [](int64_t k) { return k == 4 || k == 5; }));
    CHECK(std::count(timed.begin(), timed.end(), 6) <= 1);  // 6 tried at most once, then known dearer
  }
  // the estimate follows the passes: (kept + 1/2) / (trials + 1)
  opt::detail::DraftLength est(8, true, 0.0, 4.0);
  est.update(4, 2);  // 2 kept, 1 rejected: 3 trials
  CHECK(est.acceptance() == doctest::Approx(2.5 / 4.0));
  // never right: 4, 1, 1, then 2 plain steps (K 0), 1, 1, 1, then 4 plain steps
  opt::detail::DraftLength never(16, true);
  std::vector<int64_t> ks;
  for (int i = 0; i < 14; ++i) {
    ks.push_back(never.next());
    never.update(ks.back(), 0);
  }
  CHECK(ks == std::vector<int64_t>{4, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1});
  opt::detail::DraftLength small(2, true), fixed(16, false);
  CHECK(small.next() == 2);
  CHECK(fixed.next() == 16);
  fixed.update(16, 0);
  CHECK(fixed.next() == 16);
}

TEST_CASE("adaptive K: a length priced by one slow pass is timed again once that timing is stale") {
  // Zen 5-like passes (plain steps by rows: 5 rows 1.02, 6 rows 1.0, 7 rows 1.17), drafts at 0.53 of a step, every
  // proposal kept, and the first pass (5 rows, K 4) timed at 1.5 times its cost, as a first pass after the prompt
  // can be. Without retiming, K stays at 3 for good; with it, K reaches 5 and keeps it, trying 6 again now and then.
  const auto steps = [](int64_t m) {
    static const double t[] = {0, 1.0, 1.0, 1.0, 1.0, 1.02, 1.0, 1.17, 1.6, 1.7};
    return m < 10 ? t[m] : 0.2 * double(m);
  };
  opt::detail::DraftLength dl(8, true, 0.53, 4.0);
  std::vector<int64_t> ks;
  for (int i = 0; i < 40; ++i) {
    const int64_t k = dl.next();
    ks.push_back(k);
    dl.observe(5.3 * double(k), k, 10.0 * (i == 0 ? 1.5 : 1.0) * steps(k + 1), k + 1);
    dl.update(k, k);
  }
  CHECK(ks[0] == 4);
  CHECK(ks[1] == 3);  // priced by the slow first pass
  CHECK(std::count(ks.begin(), ks.begin() + 2 + opt::detail::DraftLength::kStale, 3) ==
        opt::detail::DraftLength::kStale);
  // the last 20 passes: 5, with 6 tried at most once in kStale + 1 passes
  CHECK(std::all_of(ks.begin() + 20, ks.end(), [](int64_t k) { return k == 5 || k == 6; }));
  CHECK(std::count(ks.begin() + 20, ks.end(), 6) <= 20 / (opt::detail::DraftLength::kStale + 1) + 1);
  CHECK(std::count(ks.begin() + 20, ks.end(), 5) >= 16);
}

TEST_CASE("a model drafter's token cost is its decode bytes over the target's") {
  const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  opt::LoadOptions lo;
  lo.quantize = opt::quantization::int8;
  lo.quantize_lm_head = true;
  const opt::Model q = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"), lo);
  CHECK(opt::ModelDrafter(m).token_cost(m) == 1.0);
  const double c = opt::ModelDrafter(q).token_cost(m);
  CHECK(c == doctest::Approx(double(q.decode_weight_bytes()) / double(m.decode_weight_bytes())));
  CHECK(c < 0.5);  // int8 of f32 weights, scales included
  CHECK(opt::PromptLookupDrafter().token_cost(m) == 0.0);
}

TEST_CASE("verify_rows 0 (the default) plans with verify_rows_for: by the kernels in use and the weight type") {
  CHECK(opt::SpeculativeOptions().verify_rows == 0.0);
  const opt::Model f = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  opt::LoadOptions lo;
  lo.quantize = opt::quantization::int8;
  const opt::Model q = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"), lo);
  const double rf = opt::verify_rows_for(f), rq = opt::verify_rows_for(q);
  CHECK(rf >= 1.0);
  CHECK(rq >= 1.0);
  CHECK(rq <= rf);  // an int8 row costs more arithmetic per byte read than an f32 one
  if (opt::kernels::active_isa() == opt::kernels::isa::scalar) {
    CHECK(rf == 1.0);
    CHECK(rq == 1.0);
  }
  // accepted, and the same output as an explicit value (K only changes the speed)
  opt::Workspace ws(1);
  opt::GenerateOptions go;
  go.max_new_tokens = 12;
  opt::PromptLookupDrafter d;
  opt::SpeculativeOptions a, b;
  b.verify_rows = 7;
  CHECK(opt::speculative_generate_ids(f, {{2, 5, 9, 2, 5}}, go, d, a, ws).sequences ==
        opt::speculative_generate_ids(f, {{2, 5, 9, 2, 5}}, go, d, b, ws).sequences);
}

TEST_CASE("speculative decoding refuses bad options") {
  const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::PromptLookupDrafter d;
  opt::Workspace ws(1);
  opt::GenerateOptions go;
  go.sampling.do_sample = true;
  go.sampling.top_p = 0.0f;
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {{2, 5}}, go, d, {}, ws), opt::input_error);
  go = {};
  CHECK_THROWS_AS(opt::speculation(nullptr), opt::input_error);
  opt::SpeculativeOptions big;
  big.draft_tokens = 65;
  CHECK_THROWS_AS(opt::speculation(std::make_shared<opt::PromptLookupDrafter>(), big), opt::input_error);
  opt::SpeculativeOptions rows;
  rows.verify_rows = 0.5;
  CHECK_THROWS_AS(opt::speculation(std::make_shared<opt::PromptLookupDrafter>(), rows), opt::input_error);
  rows.verify_rows = -1;
  CHECK_THROWS_AS(opt::speculation(std::make_shared<opt::PromptLookupDrafter>(), rows), opt::input_error);
  rows.verify_rows = std::nan("");
  CHECK_THROWS_AS(opt::speculation(std::make_shared<opt::PromptLookupDrafter>(), rows), opt::input_error);
  opt::SpeculativeOptions cost;
  cost.draft_cost = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(opt::speculation(std::make_shared<opt::PromptLookupDrafter>(), cost), opt::input_error);
  opt::SpeculativeOptions so;
  so.draft_tokens = -1;
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {{2, 5}}, go, d, so, ws), opt::input_error);
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {{2, 999}}, go, d, {}, ws), opt::input_error);
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {}, go, d, {}, ws), opt::input_error);
  go.max_new_tokens = 1000;
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {{2, 5}}, go, d, {}, ws), opt::input_error);
}

TEST_CASE("speculative decoding with an F16 or BF16 KV cache gives plain decoding's output with that cache") {
  const auto dir = opt_test::fixture_dir("opt-tiny-odd");
  const opt::Model m = opt::Model::load(dir);
  const opt::Model self = opt::Model::load(dir);
  const std::vector<std::vector<int32_t>> rows = {{2, 11, 12, 13}, {2, 40, 41, 40, 41}, {2, 7}};
  for (opt::dtype kv : {opt::dtype::F16, opt::dtype::BF16}) {
    INFO(std::string(opt::to_string(kv)));
    opt::GenerateOptions go;
    go.max_new_tokens = 12;
    go.kv_cache = kv;
    opt::Workspace ws(2);
    const opt::GenerateResult plain = opt::generate_ids(m, rows, go, ws, true);
    opt::GenerateOptions f32 = go;
    f32.kv_cache = opt::dtype::F32;
    const opt::GenerateResult exact = opt::generate_ids(m, rows, f32, ws, true);
    CHECK(plain.first_logits != exact.first_logits);  // the cache type really is in use
    opt::PromptLookupDrafter lookup(2);
    opt::ModelDrafter draft(self, 1);
    for (opt::Drafter* d : {static_cast<opt::Drafter*>(&lookup), static_cast<opt::Drafter*>(&draft)}) {
      const opt::GenerateResult r = opt::speculative_generate_ids(m, rows, go, *d, {}, ws, true);
      CHECK(r.new_tokens == plain.new_tokens);
      CHECK(r.first_logits == plain.first_logits);
    }
  }
}

// ---- inside opt::Batch ----------------------------------------------------------------------------------------

namespace {

// One sequence's new tokens and the logits that chose each (StepToken::logits).
struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  opt::FinishReason reason = opt::FinishReason::none;
};

// Runs one sequence alone in its own Batch.
Run alone(const opt::Model& m, const std::vector<int32_t>& prompt, const opt::SequenceOptions& so) {
  opt::Batch b(m, 1);
  const opt::SeqId id = b.add(prompt, so);
  Run r;
  while (!b.empty())
    for (const opt::StepToken& t : b.step()) {
      REQUIRE(t.seq == id);
      REQUIRE(t.logits);
      r.tokens.push_back(t.token);
      r.logits.emplace_back(t.logits, t.logits + m.config().vocab_size);
    }
  r.reason = b.finish_reason(id);
  CHECK(b.new_tokens(id) == r.tokens);
  return r;
}

opt::SequenceOptions speculating(std::shared_ptr<opt::Drafter> d, int64_t k, bool adaptive, int64_t max_new,
                                 opt::SpeculativeStats* stats = nullptr) {
  opt::SequenceOptions so;
  so.max_new_tokens = max_new;
  opt::SpeculativeOptions sp;
  sp.draft_tokens = k;
  sp.adaptive = adaptive;
  so.speculation = opt::speculation(std::move(d), sp, stats);
  return so;
}

// A drafter that samples its proposals from a model with the sequence's sampling options and its own seeded
// stream, and reports the distribution q each was drawn from.
class SamplingDrafter : public opt::Drafter {
 public:
  SamplingDrafter(const opt::Model& draft, const opt::SamplingOptions& so, opt::Workspace& ws)
      : m_(draft), s_(so), ws_(ws) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    const int64_t V = m_.config().vocab_size;
    opt::KvCache kv(m_.config(), int64_t(t.size()) + k);
    std::vector<int32_t> hist = t, out;
    q_.clear();
    opt::LogitsView lv = m_.forward({{&kv, t.data(), int64_t(t.size())}}, ws_);
    for (int64_t j = 0; j < k; ++j) {
      q_.push_back(s_.distribution(lv.row(0), V, hist));
      out.push_back(opt::Sampler::draw(q_.back(), s_.uniform()));
      hist.push_back(out.back());
      if (j + 1 < k) lv = m_.forward({{&kv, &out.back(), 1}}, ws_);
    }
    return out;
  }
  const std::vector<double>* draft_distribution(size_t j) const override {
    return j < q_.size() ? &q_[j] : nullptr;
  }

 private:
  opt::Model m_;
  opt::Sampler s_;
  opt::Workspace& ws_;
  std::vector<std::vector<double>> q_;
};

}  // namespace

TEST_CASE("in a Batch, speculating and plain sequences joining at different steps each get their plain run") {
  const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::LoadOptions q8;
  q8.quantize = opt::quantization::int8;
  const opt::Model self8 = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"), q8);
  const int64_t V = m.config().vocab_size, max_new = 20;
  const std::vector<std::vector<int32_t>> rows = {{2, 11, 12, 13, 11, 12}, {2, 40, 41, 40, 41}, {2, 7},
                                                  {2, 5, 6, 7, 8, 5, 6},   {2, 9, 9, 9},         {2, 30, 31}};
  const Plain p = plain(m, rows, max_new);
  // greedy sequences: 0 plain, 1 lookup K=4, 2 self int8 K=2 adaptive, 3 always right K=7, 4 always wrong K=1,
  // 5 lookup K=2 stopped by on_token after 5 tokens; then sampling ones: 6 lookup, 7 self int8, 8 plain
  std::vector<opt::SequenceOptions> kinds(9);
  kinds[0].max_new_tokens = max_new;
  kinds[1] = speculating(std::make_shared<opt::PromptLookupDrafter>(2), 4, false, max_new);
  kinds[2] = speculating(std::make_shared<opt::ModelDrafter>(self8, 1), 2, true, max_new);
  kinds[3] = speculating(std::make_shared<ScriptedDrafter>(p, rows, true, V), 7, false, max_new);
  kinds[4] = speculating(std::make_shared<ScriptedDrafter>(p, rows, false, V), 1, false, max_new);
  kinds[5] = speculating(std::make_shared<opt::PromptLookupDrafter>(1), 2, false, max_new);
  kinds[6] = speculating(std::make_shared<opt::PromptLookupDrafter>(1), 3, false, max_new);
  kinds[7] = speculating(std::make_shared<opt::ModelDrafter>(self8, 1), 3, true, max_new);
  kinds[8].max_new_tokens = max_new;
  for (size_t k = 6; k < 9; ++k) {
    kinds[k].sampling.do_sample = true;
    kinds[k].sampling.top_k = 4;
    kinds[k].sampling.seed = 7 + k;
    kinds[k].sampling.repetition_penalty = 1.1f;
  }
  struct Entry {
    size_t row, kind;
    int64_t join;  // the step before which it joins
  };
  std::vector<Entry> plan;
  for (size_t k = 0; k < kinds.size(); ++k) plan.push_back({k % rows.size(), k, int64_t(k % 4) * 3});
  plan.push_back({1, 0, 5}), plan.push_back({1, 1, 5}), plan.push_back({2, 3, 0});  // same prompt, other kinds
  opt::Workspace ws(2);
  opt::Batch b(m, ws);
  std::map<opt::SeqId, size_t> entry_of;
  std::vector<Run> got(plan.size());
  std::vector<opt::SeqId> ids(plan.size());
  for (int64_t step = 0; step < 200 && (step <= 12 || !b.empty()); ++step) {
    for (size_t e = 0; e < plan.size(); ++e)
      if (plan[e].join == step) entry_of[ids[e] = b.add(rows[plan[e].row], kinds[plan[e].kind])] = e;
    if (b.empty()) continue;
    std::map<opt::SeqId, size_t> last;  // tokens of a sequence in one step arrive in order
    b.step([&](const opt::StepToken& t) {
      Run& r = got[entry_of.at(t.seq)];
      REQUIRE(t.logits);
      r.tokens.push_back(t.token);
      r.logits.emplace_back(t.logits, t.logits + V);
      return !(plan[entry_of.at(t.seq)].kind == 5 && r.tokens.size() == 5);
    });
  }
  REQUIRE(b.empty());
  for (size_t e = 0; e < plan.size(); ++e) {
    const Entry& en = plan[e];
    INFO("entry " << e << " row " << en.row << " kind " << en.kind);
    Run& r = got[e];
    CHECK(b.new_tokens(ids[e]) == r.tokens);
    if (en.kind < 5) {
      CHECK(r.tokens == p.tokens[en.row]);
      CHECK(r.logits == p.logits[en.row]);  // bit for bit
    } else if (en.kind == 5) {
      REQUIRE(r.tokens.size() == 5);
      CHECK(b.finish_reason(ids[e]) == opt::FinishReason::stopped);
      CHECK(r.tokens == std::vector<int32_t>(p.tokens[en.row].begin(), p.tokens[en.row].begin() + 5));
      CHECK(r.logits == std::vector<std::vector<float>>(p.logits[en.row].begin(), p.logits[en.row].begin() + 5));
    } else {  // sampling: the run it gets alone (the same seed, the same output, whatever else is in the batch)
      const opt::SequenceOptions& so = kinds[en.kind];
      const Run a = alone(m, rows[en.row], so);
      CHECK(r.tokens == a.tokens);
      CHECK(r.logits == a.logits);
      CHECK(b.finish_reason(ids[e]) == a.reason);
      opt::SequenceOptions other = so;
      other.sampling.seed += 1000;
      CHECK(alone(m, rows[en.row], other).tokens != a.tokens);  // the seed is in use
    }
  }
}

TEST_CASE("Sampler::distribution is what sample() draws from, with uniform() the number it takes") {
  const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::Workspace ws(1);
  opt::KvCache kv(m.config());
  const std::vector<int32_t> prompt = {2, 11, 12, 13, 11};
  const opt::LogitsView lv = m.forward({{&kv, prompt.data(), int64_t(prompt.size())}}, ws);
  const int64_t V = lv.cols;
  for (int variant = 0; variant < 4; ++variant) {
    opt::SamplingOptions so;
    so.do_sample = variant != 3;
    so.top_k = variant == 1 ? 5 : 0;
    so.top_p = variant == 2 ? 0.8f : 1.0f;
    so.temperature = variant == 2 ? 0.7f : 1.0f;
    so.repetition_penalty = 1.3f;
    so.seed = 42;
    opt::Sampler a(so), b(so);
    for (int i = 0; i < 50; ++i) {
      const int32_t x = a.sample(lv.row(0), V, prompt);
      const std::vector<double>& p = b.distribution(lv.row(0), V, prompt);
      // greedy: all on the penalized argmax
      const int32_t y = so.do_sample ? opt::Sampler::draw(p, b.uniform())
                                     : int32_t(std::max_element(p.begin(), p.end()) - p.begin());
      CHECK(x == y);
      double sum = 0;
      for (double v : p) sum += v;
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
      if (variant == 1) CHECK(std::count_if(p.begin(), p.end(), [](double v) { return v > 0; }) == 5);
    }
  }
}

TEST_CASE("speculative sampling's rule on hand-made p and q: keep x with min(1, p/q), else the exact residual") {
  const std::vector<double> p = {0.5, 0.2, 0.3, 0.0}, q = {0.2, 0.6, 0.1, 0.1};
  CHECK(opt::draft_acceptance(p, &q, 0) == 1.0);
  CHECK(opt::draft_acceptance(p, &q, 1) == doctest::Approx(0.2 / 0.6));
  CHECK(opt::draft_acceptance(p, &q, 2) == 1.0);
  CHECK(opt::draft_acceptance(p, &q, 3) == 0.0);
  std::vector<double> r;
  for (int32_t x = 0; x < 4; ++x) {  // max(0, p - q) = {0.3, 0, 0.2, 0}, normalized
    opt::draft_residual(p, &q, x, r);
    REQUIRE(r.size() == 4);
    CHECK(r[0] == doctest::Approx(0.6));
    CHECK(r[1] == 0.0);
    CHECK(r[2] == doctest::Approx(0.4));
    CHECK(r[3] == 0.0);
  }
  // deterministic proposals (q all on x): kept with p(x), else p without x
  CHECK(opt::draft_acceptance(p, nullptr, 0) == 0.5);
  CHECK(opt::draft_acceptance(p, nullptr, 3) == 0.0);
  opt::draft_residual(p, nullptr, 0, r);
  CHECK(r == std::vector<double>{0.0, 0.2 / 0.5, 0.3 / 0.5, 0.0});
  opt::draft_residual(p, nullptr, 3, r);
  CHECK(r == p);
  // the token that comes out is distributed as p: sum over x ~ q of keep(x) [x] + (1 - keep(x)) residual
  const std::vector<std::vector<double>> ps = {p, {0.25, 0.25, 0.25, 0.25}, {0.0, 0.0, 1.0, 0.0}, {0.7, 0.1, 0.1, 0.1}};
  const std::vector<std::vector<double>> qs = {q, {0.9, 0.05, 0.05, 0.0}, {0.25, 0.25, 0.25, 0.25}, p};
  for (const auto& pp : ps)
    for (const auto& qq : qs)
      for (bool point : {false, true}) {
        std::vector<double> out(4, 0.0);
        for (int32_t x = 0; x < 4; ++x) {
          const double wx = point ? 1.0 / 4 : qq[size_t(x)];  // point: x chosen by anything, q all on it
          if (wx == 0) continue;
          const std::vector<double>* qp = point ? nullptr : &qq;
          const double a = opt::draft_acceptance(pp, qp, x);
          opt::draft_residual(pp, qp, x, r);
          out[size_t(x)] += wx * a;
          for (size_t y = 0; y < 4; ++y) out[y] += wx * (1 - a) * r[y];
        }
        if (point) continue;  // a mixture of point masses is not q-drafting; checked per x below
        for (size_t y = 0; y < 4; ++y) CHECK(out[y] == doctest::Approx(pp[y]).epsilon(1e-12));
      }
  for (const auto& pp : ps)
    for (int32_t x = 0; x < 4; ++x) {  // one deterministic proposal: the output is p, whatever x
      const double a = opt::draft_acceptance(pp, nullptr, x);
      opt::draft_residual(pp, nullptr, x, r);
      for (size_t y = 0; y < 4; ++y)
        CHECK(a * (int32_t(y) == x) + (1 - a) * r[y] == doctest::Approx(pp[y]).epsilon(1e-12));
    }
  // judge_draft with chosen uniforms: u < 1/3 keeps x = 1; else v picks from the residual {0.6, 0, 0.4, 0}
  std::vector<double> scratch;
  opt::DraftVerdict v = opt::judge_draft(p, &q, 1, 0.3, 0.9, scratch);
  CHECK((v.accepted && v.token == 1));
  v = opt::judge_draft(p, &q, 1, 0.34, 0.5, scratch);
  CHECK((!v.accepted && v.token == 0));
  v = opt::judge_draft(p, &q, 1, 0.34, 0.7, scratch);
  CHECK((!v.accepted && v.token == 2));
  v = opt::judge_draft(p, nullptr, 3, 0.0, 0.75, scratch);  // p(3) = 0: never kept; p = {0.5, 0.2, 0.3, 0}
  CHECK((!v.accepted && v.token == 2));
  CHECK_THROWS_AS(opt::draft_acceptance(p, &q, 4), opt::input_error);
  const std::vector<double> short_q = {1.0};
  CHECK_THROWS_AS(opt::draft_acceptance(p, &short_q, 0), opt::input_error);
}

namespace {

using Joint = std::map<std::vector<int32_t>, double>;

// The exact probability of each first-`depth`-token continuation of `prompt` when sampling with `so` (each token
// from the distribution Sampler::distribution gives after the prompt and the tokens before it; EOS ends one).
void exact_joint(const opt::Model& m, const std::vector<int32_t>& prompt, const opt::SamplingOptions& so,
                 size_t depth, std::vector<int32_t> prefix, double prob, Joint& out) {
  if (prefix.size() == depth || (!prefix.empty() && prefix.back() == m.config().eos_token_id)) {
    out[prefix] += prob;
    return;
  }
  std::vector<int32_t> hist = prompt;
  hist.insert(hist.end(), prefix.begin(), prefix.end());
  opt::Workspace ws(1);
  opt::KvCache kv(m.config());
  const opt::LogitsView lv = m.forward({{&kv, hist.data(), int64_t(hist.size())}}, ws);
  opt::Sampler s(so);
  const std::vector<double> p = s.distribution(lv.row(0), lv.cols, hist);
  for (size_t id = 0; id < p.size(); ++id) {
    if (p[id] <= 0) continue;
    prefix.push_back(int32_t(id));
    exact_joint(m, prompt, so, depth, prefix, prob * p[id], out);
    prefix.pop_back();
  }
}

// Pearson's chi-square of observed counts against exact probabilities (cells expecting < 5 pooled); every
// observed continuation must be possible.
double chi_square(const Joint& exact, const std::map<std::vector<int32_t>, int64_t>& counts, int64_t n,
                  int64_t& dof) {
  for (const auto& [k, c] : counts) CHECK_MESSAGE(exact.count(k), "an impossible continuation was sampled");
  double x2 = 0, pooled_e = 0, pooled_o = 0;
  dof = -1;
  for (const auto& [k, pr] : exact) {
    const double e = pr * double(n);
    const auto it = counts.find(k);
    const double o = it == counts.end() ? 0.0 : double(it->second);
    if (e < 5) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    x2 += (o - e) * (o - e) / e;
    ++dof;
  }
  if (pooled_e > 0) x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++dof;
  return x2;
}

}  // namespace

TEST_CASE("speculative sampling keeps the distribution: the first 3 tokens over 3000 seeds, against the exact one") {
  const auto dir = opt_test::fixture_dir("opt-tiny-preln");
  const opt::Model m = opt::Model::load(dir);
  opt::LoadOptions q8;
  q8.quantize = opt::quantization::int8;
  const opt::Model self8 = opt::Model::load(dir, q8);
  const std::vector<int32_t> prompt = {2, 11, 12, 13, 11, 12};
  opt::SamplingOptions base;
  base.do_sample = true;
  base.top_k = 3;
  base.temperature = 1.5f;
  base.repetition_penalty = 1.2f;
  const size_t depth = 3;
  Joint exact;
  exact_joint(m, prompt, base, depth, {}, 1.0, exact);
  REQUIRE(exact.size() > 10);
  const int64_t N = 3000, per_batch = 500;
  opt::Workspace ws(2), dws(1);
  for (const std::string drafter : {"plain", "self int8 (greedy)", "lookup", "sampling self int8"}) {
    INFO(drafter);
    opt::SpeculativeStats stats;
    std::map<std::vector<int32_t>, int64_t> counts;
    std::vector<std::vector<int32_t>> outputs;
    for (int64_t from = 0; from < N; from += per_batch) {
      opt::Batch b(m, ws);
      std::vector<opt::SeqId> ids;
      for (int64_t seed = from; seed < from + per_batch; ++seed) {
        opt::SamplingOptions so = base;
        so.seed = uint64_t(seed);
        std::shared_ptr<opt::Drafter> d;
        if (drafter == "self int8 (greedy)") d = std::make_shared<opt::ModelDrafter>(self8, 1);
        if (drafter == "lookup") d = std::make_shared<opt::PromptLookupDrafter>(2);
        opt::SamplingOptions dso = base;
        dso.seed = uint64_t(seed) + 1000000;
        dso.top_k = 6;  // q differs from p (and covers ids p rules out): both branches of the rule run
        dso.temperature = 2.0f;
        if (drafter == "sampling self int8") d = std::make_shared<SamplingDrafter>(self8, dso, dws);
        opt::SequenceOptions sq = d ? speculating(d, 2, false, int64_t(depth) + 1, &stats) : opt::SequenceOptions{};
        sq.max_new_tokens = int64_t(depth) + 1;
        sq.sampling = so;
        ids.push_back(b.add(prompt, sq));
      }
      while (!b.empty()) b.step();
      for (opt::SeqId id : ids) {
        std::vector<int32_t> t = b.new_tokens(id);
        if (t.size() > depth) t.resize(depth);
        ++counts[t];
        outputs.push_back(t);
      }
    }
    int64_t dof = 0;
    const double x2 = chi_square(exact, counts, N, dof);
    double tv = 0;
    for (const auto& [k, pr] : exact) tv += std::abs(pr - double(counts.count(k) ? counts.at(k) : 0) / double(N));
    tv /= 2;
    MESSAGE(drafter << ": chi-square " << x2 << " on " << dof << " degrees of freedom, total variation " << tv
                    << "; proposed " << stats.proposed << ", accepted " << stats.accepted);
    // P(chi-square > dof + 6 sqrt(2 dof)) is below 1e-4 for these dof; a wrong rule gives hundreds or thousands
    CHECK(x2 < double(dof) + 6.0 * std::sqrt(2.0 * double(dof)));
    if (drafter != "plain") {  // both branches of the rule ran
      CHECK(stats.accepted > 100);
      CHECK(stats.proposed - stats.accepted > 100);
    }
    if (drafter == "self int8 (greedy)") {  // the same seeds, the same output
      opt::Batch b(m, ws);
      opt::SamplingOptions so = base;
      so.seed = 17;
      opt::SequenceOptions sq = speculating(std::make_shared<opt::ModelDrafter>(self8, 1), 2, false, 4);
      sq.sampling = so;
      const opt::SeqId id = b.add(prompt, sq);
      while (!b.empty()) b.step();
      std::vector<int32_t> t = b.new_tokens(id);
      t.resize(depth);
      CHECK(t == outputs[17]);
    }
  }
}
