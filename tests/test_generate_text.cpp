// Text in, text out with the real tokenizer and the real-vocabulary fixture: answers equal transformers'
// batch_decode of the generated sequences; streaming pieces are whole UTF-8 and add up to the answer; stop
// strings (also split across tokens) end the text and are never emitted.
#include <opt/generate.hpp>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

struct Fixture {
  opt::Model model = opt::Model::load(opt_test::fixture_dir("opt-tiny-realvocab"));
  opt::Tokenizer tok = opt::Tokenizer::from_dir(opt_test::shared_dir() / "tokenizer");
  json goldens = opt_test::read_json(opt_test::fixture_dir("opt-tiny-realvocab") / "goldens.json");
};

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("generate(text): the seed's answers, equal to HF batch_decode") {
  Fixture f;
  size_t checked = 0;
  for (const json& cs : f.goldens["cases"]) {
    const json& g = cs["generate"];
    if (!g.contains("decoded")) continue;
    ++checked;
    INFO(cs["name"].get<std::string>());
    std::vector<std::string> texts = cs.at("texts").get<std::vector<std::string>>();
    opt::GenerateOptions o;
    o.max_new_tokens = g["max_new_tokens"];
    std::vector<std::string> pieces(texts.size());
    o.on_text = [&](size_t row, int32_t, std::string_view piece) {
      CHECK(valid_utf8(piece));
      pieces[row] += piece;
      return true;
    };
    opt::Workspace ws(2);
    opt::GenerateResult r = opt::generate(f.model, f.tok, texts, o, ws);
    REQUIRE(r.texts.size() == texts.size());
    REQUIRE(r.completions.size() == texts.size());
    // every row as it comes out alone (HF's right-padded batch is wrong for short rows; see shared/README)
    auto want = [&](size_t b, const char* key) {
      return (g.contains("alone") ? g["alone"][b].at(key) : g.at(key)[b]).get<std::string>();
    };
    for (size_t b = 0; b < texts.size(); ++b) {
      CHECK(r.texts[b] == want(b, "decoded"));
      CHECK(r.completions[b] == want(b, "decoded_new"));
      CHECK(!r.completions[b].empty());
      CHECK(pieces[b] == r.completions[b]);
      CHECK(r.texts[b].rfind(texts[b], 0) == 0);  // the answer starts with its prompt
    }
    o.return_full_text = false;
    o.on_text = nullptr;
    r = opt::generate(f.model, f.tok, texts, o, ws);
    REQUIRE(r.texts.size() == texts.size());
    for (size_t b = 0; b < texts.size(); ++b) {
      CHECK(r.texts[b] == want(b, "decoded_new"));  // the completion alone, as HF's return_full_text=False
      CHECK(r.completions[b] == want(b, "decoded_new"));
    }
  }
  CHECK(checked >= 3);  // single, batch_left, batch_right: every realvocab case has decoded text
}

TEST_CASE("generate(text): stop strings, within a token and across tokens") {
  Fixture f;
  // alone, "Hello, my dog is cute" continues with "Albert min BrittxxinnPET() prayed"
  const std::string prompt = "Hello, my dog is cute";
  opt::GenerateOptions o;
  o.max_new_tokens = 8;
  CHECK(opt::generate(f.model, f.tok, prompt, o) == "Hello, my dog is cuteAlbert min BrittxxinnPET() prayed");
  for (auto [stop, want] : std::vector<std::pair<std::string, std::string>>{
           {" min", "Albert"}, {"rt mi", "Albe"}, {"Albert", ""}, {"()", "Albert min BrittxxinnPET"}, {"zzz", "Albert min BrittxxinnPET() prayed"}}) {
    INFO("stop " << stop);
    o.stop = {"never here", stop};
    std::string streamed;
    o.on_text = [&](size_t, int32_t, std::string_view piece) {
      streamed += piece;
      CHECK(streamed.find(stop) == std::string::npos);
      return true;
    };
    opt::GenerateResult r = opt::generate(f.model, f.tok, std::vector<std::string>{prompt}, o);
    CHECK(r.completions[0] == want);
    CHECK(streamed == want);
    CHECK(r.texts[0] == prompt + want);
    bool hit = stop != "zzz";
    CHECK(r.finish_reasons[0] == (hit ? opt::FinishReason::stopped : opt::FinishReason::length));
    if (hit) CHECK(r.new_tokens[0].size() < 8);  // generation stopped early
  }
  o.stop = {""};
  CHECK_THROWS_AS(opt::generate(f.model, f.tok, prompt, o), opt::input_error);
}

TEST_CASE("generate(text): on_text can stop a row; prompts can be truncated") {
  Fixture f;
  opt::GenerateOptions o;
  o.max_new_tokens = 8;
  int calls = 0;
  o.on_text = [&](size_t, int32_t id, std::string_view) {
    if (id >= 0) ++calls;
    return calls < 3;
  };
  auto r = opt::generate(f.model, f.tok, std::vector<std::string>{"Hello, my dog is cute"}, o);
  CHECK(r.new_tokens[0].size() == 3);
  opt::GenerateOptions t;
  t.max_new_tokens = 2;
  t.max_prompt_tokens = 3;
  r = opt::generate(f.model, f.tok, std::vector<std::string>{"Hello, my dog is cute"}, t);
  CHECK(r.sequences[0].size() == 5);
  CHECK(r.texts[0].rfind("Hello,", 0) == 0);
}
