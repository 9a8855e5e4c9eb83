// Speculative decoding gives plain greedy decoding's output exactly: on every fixture's generation cases, with
// each drafter (prompt lookup, the model's own int8 weights, another model, one that is always right, one that is
// always wrong) and K in {1, 2, 4, 7}, the new ids equal transformers' goldens and the logits that chose each token
// equal plain decoding's bit for bit.
#include <opt/speculative.hpp>
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

TEST_CASE("speculative decoding refuses what it cannot keep exact") {
  const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::PromptLookupDrafter d;
  opt::Workspace ws(1);
  opt::GenerateOptions go;
  go.sampling.do_sample = true;
  go.sampling.temperature = 0.7f;
  CHECK_THROWS_AS(opt::speculative_generate_ids(m, {{2, 5}}, go, d, {}, ws), opt::input_error);
  go = {};
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
