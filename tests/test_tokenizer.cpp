// opt::Tokenizer against Hugging Face's GPT2Tokenizer goldens (../shared/tokenizer/tok_goldens.json and the
// decoded texts of fixtures/opt-tiny-realvocab), tokenizer.json loading, round-trip properties, the streaming
// decoder, malformed files and invalid UTF-8.
#include <opt/tokenizer.hpp>

#include <cstdio>
#include <random>
#include <set>

#include "shared.hpp"

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

fs::path tok_dir() { return opt_test::shared_dir() / "tokenizer"; }

const opt::Tokenizer& opt_tok() {
  static const opt::Tokenizer tok = opt::Tokenizer::from_dir(tok_dir());
  return tok;
}

const json& goldens() {
  static const json g = opt_test::read_json(tok_dir() / "tok_goldens.json");
  return g;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

bool valid_utf8(std::string_view s) {
  std::string repaired;
  opt::detail::utf8_repair_append(s, true, repaired);
  return repaired == s;
}

// Python's bytes.decode("utf-8", errors="replace"), via the library's own repair (tested against goldens below).
std::string py_replace(std::string_view s) {
  std::string out;
  opt::detail::utf8_repair_append(s, true, out);
  return out;
}

std::string utf8(char32_t cp) {
  std::string s;
  opt::detail::append_utf8(s, cp);
  return s;
}

// Random valid UTF-8 across scripts, emoji sequences and every kind of whitespace.
std::string random_text(std::mt19937& rng, size_t max_chars) {
  static const std::vector<std::pair<char32_t, char32_t>> kRanges = {
      {'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'!', '/'}, {':', '@'}, {'[', '`'}, {'{', '~'},
      {0x00A1, 0x00FF}, {0x0100, 0x017F}, {0x0391, 0x03C9}, {0x0400, 0x04FF}, {0x05D0, 0x05EA}, {0x0620, 0x064A},
      {0x0660, 0x0669}, {0x0900, 0x097F}, {0x0E01, 0x0E5B}, {0x3041, 0x3096}, {0x30A1, 0x30FA}, {0x4E00, 0x9FFF},
      {0xAC00, 0xD7A3}, {0x2070, 0x209C}, {0x2150, 0x218B}, {0x2200, 0x22FF}, {0x2010, 0x2027}, {0x20A0, 0x20C0},
      {0x0300, 0x036F}, {0xFF01, 0xFF5E}, {0x1F300, 0x1F64F}, {0x1F900, 0x1F9FF}, {0x1F1E6, 0x1F1FF},
      {0x1F3FB, 0x1F3FF}, {0x1D400, 0x1D7FF}, {0x10400, 0x1044F}, {0x20000, 0x2A6DF}, {0xE000, 0xE0FF}};
  static const std::vector<char32_t> kSpaces = {' ', ' ', ' ', ' ', '\t', '\n', '\n', '\r', 0x0B, 0x0C, 0x1C, 0x1F,
                                                0x85, 0xA0, 0x1680, 0x2000, 0x2007, 0x200A, 0x200B, 0x2028, 0x2029,
                                                0x202F, 0x205F, 0x3000, 0xFEFF, 0x180E};
  static const std::vector<std::string> kPieces = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "''", " '",
                                                   "n't", "\xE2\x80\x8D", "\xEF\xB8\x8F", "\r\n", "  ", "\n\n",
                                                   "http://x.y/z?a=1", "1,000.5", "</", "<pa"};
  std::uniform_int_distribution<size_t> len(0, max_chars);
  std::string s;
  const size_t n = len(rng);
  for (size_t i = 0; i < n; ++i) {
    const unsigned kind = rng() % 10;
    if (kind < 3) {
      s += utf8(kSpaces[rng() % kSpaces.size()]);
    } else if (kind == 3) {
      s += kPieces[rng() % kPieces.size()];
    } else {
      const auto& r = kRanges[rng() % kRanges.size()];
      s += utf8(r.first + static_cast<char32_t>(rng() % (r.second - r.first + 1)));
    }
  }
  return s;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  opt::detail::pretokenize(text, [&](size_t b, size_t e) { out.emplace_back(text.substr(b, e - b)); });
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const opt::error& e) {
    return e.what();
  }
  return "(no exception)";
}

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("opt_test_tokenizer_" + name + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, std::string_view content) const {
    std::ofstream f(path / name, std::ios::binary);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
};

// A tokenizer.json built from the real vocab.json and merges.txt.
json make_tokenizer_json(bool pair_merges, bool with_template) {
  json vocab = opt_test::read_json(tok_dir() / "vocab.json");
  const std::string merges_txt = opt_test::read_text(tok_dir() / "merges.txt");
  json merges = json::array();
  size_t pos = 0;
  bool first = true;
  while (pos < merges_txt.size()) {
    size_t eol = merges_txt.find('\n', pos);
    if (eol == std::string::npos) eol = merges_txt.size();
    const std::string line = merges_txt.substr(pos, eol - pos);
    pos = eol + 1;
    if (first) {
      first = false;
      if (line.rfind("#version", 0) == 0) continue;
    }
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (pair_merges)
      merges.push_back(json::array({line.substr(0, sp), line.substr(sp + 1)}));
    else
      merges.push_back(line);
  }
  auto added = [](int id, const char* content) {
    return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", true}, {"special", true}};
  };
  json tj = {{"version", "1.0"},
             {"truncation", nullptr},
             {"padding", nullptr},
             {"added_tokens", json::array({added(1, "<pad>"), added(2, "</s>")})},
             {"normalizer", nullptr},
             {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
             {"post_processor", nullptr},
             {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
             {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false},
                        {"vocab", vocab}, {"merges", merges}}}};
  if (with_template) {
    tj["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", json::array({{{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}},
                                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                            {"pair", json::array()},
                            {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  }
  return tj;
}

}  // namespace

TEST_CASE("tokenizer: special ids and sizes match facebook/opt-125m") {
  const auto& tok = opt_tok();
  const json& t = goldens().at("tokenizer");
  CHECK(tok.bos_token_id() == t.at("bos_token_id").get<int>());
  CHECK(tok.eos_token_id() == t.at("eos_token_id").get<int>());
  CHECK(tok.unk_token_id() == t.at("unk_token_id").get<int>());
  CHECK(tok.pad_token_id() == t.at("pad_token_id").get<int>());
  CHECK(tok.vocab_size() == t.at("vocab_size").get<size_t>());
  std::set<int32_t> specials;
  for (int32_t i = 0; i < static_cast<int32_t>(tok.vocab_size()); ++i)
    if (tok.is_special(i)) specials.insert(i);
  CHECK(specials == std::set<int32_t>{1, 2});
}

TEST_CASE("tokenizer: every encode golden (ids, ids without BOS, tokens, 3 decodes)") {
  const auto& tok = opt_tok();
  const json& cases = goldens().at("encode");
  REQUIRE(cases.size() == 74);
  for (const json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    CAPTURE(text);
    CHECK(tok.encode(text) == ids_of(c.at("ids")));
    const std::vector<int32_t> plain = tok.encode(text, false);
    CHECK(plain == ids_of(c.at("ids_no_special")));
    const auto tokens = c.at("tokens").get<std::vector<std::string>>();
    REQUIRE(tokens.size() == plain.size());
    for (size_t i = 0; i < plain.size(); ++i) CHECK(tok.id_to_token(plain[i]) == tokens[i]);
    const auto ids = ids_of(c.at("ids"));
    CHECK(tok.decode(ids) == c.at("decode").get<std::string>());
    CHECK(tok.decode(ids, {true, true}) == c.at("decode_skip_special").get<std::string>());
    CHECK(tok.decode(ids, {true, false}) == c.at("decode_skip_special_no_cleanup").get<std::string>());
    if (c.at("roundtrip_exact").get<bool>()) CHECK(tok.decode(ids, {true, false}) == text);
  }
}

TEST_CASE("tokenizer: every decode golden, in all three settings; unknown ids throw") {
  const auto& tok = opt_tok();
  const json& cases = goldens().at("decode");
  REQUIRE(cases.size() == 23);
  int checked = 0;
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    CAPTURE(name);
    if (c.contains("ids_each")) {  // each id decoded alone
      for (size_t i = 0; i < c["ids_each"].size(); ++i)
        CHECK(tok.decode(ids_of(c["ids_each"][i])) == c["text_each"][i].get<std::string>());
      ++checked;
      continue;
    }
    const auto ids = ids_of(c.at("ids"));
    const std::pair<const char*, opt::DecodeOptions> settings[] = {{"skip_false_cleanup_true", {false, true}},
                                                                   {"skip_true_cleanup_true", {true, true}},
                                                                   {"skip_true_cleanup_false", {true, false}}};
    for (const auto& [key, opts] : settings) {
      CAPTURE(key);
      const json& want = c.at(key);
      if (want.contains("error")) {
        CHECK_THROWS_AS(tok.decode(ids, opts), opt::tokenizer_error);
      } else {
        CHECK(tok.decode(ids, opts) == want.at("text").get<std::string>());
      }
    }
    ++checked;
  }
  CHECK(checked == 23);
  CHECK(error_of([&] { tok.decode({31414, 50265}); }) ==
        "[opt.tokenizer] decode: id 50265 is not in the tokenizer (valid ids: 0..50264; a model may have more "
        "embedding rows than the tokenizer has tokens)");
  CHECK_THROWS_AS(tok.decode({-1}), opt::tokenizer_error);
  CHECK_THROWS_AS(tok.id_to_token(50271), opt::tokenizer_error);
  CHECK_THROWS_AS(tok.id_to_bytes(-5), opt::tokenizer_error);
}

TEST_CASE("tokenizer: padded batch, left and right, with masks and batch_decode") {
  const auto& tok = opt_tok();
  for (const char* side : {"left", "right"}) {
    CAPTURE(side);
    const json& b = goldens().at("batch").at(side);
    const auto texts = b.at("texts").get<std::vector<std::string>>();
    opt::EncodeOptions o;
    o.padding_side = std::string(side) == "left" ? opt::PaddingSide::left : opt::PaddingSide::right;
    const opt::BatchEncoding enc = tok.encode_batch(texts, o);
    CHECK(enc.input_ids == b.at("input_ids").get<std::vector<std::vector<int32_t>>>());
    CHECK(enc.attention_mask == b.at("attention_mask").get<std::vector<std::vector<int32_t>>>());
    CHECK(tok.decode_batch(enc.input_ids) == b.at("batch_decode").get<std::vector<std::string>>());
    CHECK(tok.decode_batch(enc.input_ids, {true, true}) ==
          b.at("batch_decode_skip_special").get<std::vector<std::string>>());
  }
  // default side is right, as Hugging Face's OPT tokenizer
  CHECK(opt::EncodeOptions{}.padding_side == opt::PaddingSide::right);
}

TEST_CASE("tokenizer: encode_batch truncation and max_length") {
  const auto& tok = opt_tok();
  const std::vector<std::string> texts = {"Hello, my dog is cute", "Hi"};
  opt::EncodeOptions o;
  o.max_length = 4;
  auto enc = tok.encode_batch(texts, o);
  CHECK(enc.input_ids == std::vector<std::vector<int32_t>>{{2, 31414, 6, 127}, {2, 30086, 1, 1}});
  CHECK(enc.attention_mask == std::vector<std::vector<int32_t>>{{1, 1, 1, 1}, {1, 1, 0, 0}});
  o.truncation = false;
  CHECK(error_of([&] { tok.encode_batch(texts, o); }) ==
        "[opt.input] encode_batch: text 0 has 7 tokens, more than max_length 4 (truncation is off)");
  o = {};
  o.padding = false;
  o.add_bos = false;
  enc = tok.encode_batch(texts, o);
  CHECK(enc.input_ids == std::vector<std::vector<int32_t>>{{31414, 6, 127, 2335, 16, 11962}, {30086}});
  CHECK(tok.encode_batch({}, {}).input_ids.empty());
}

TEST_CASE("tokenizer: decoded texts of the opt-tiny-realvocab goldens") {
  const auto& tok = opt_tok();
  const json g = opt_test::read_json(opt_test::fixture_dir("opt-tiny-realvocab") / "goldens.json");
  int rows = 0;
  for (const json& c : g.at("cases")) {
    CAPTURE(c.at("name").get<std::string>());
    const auto texts = c.at("texts").get<std::vector<std::string>>();
    const auto prompts = c.at("prompts").get<std::vector<std::vector<int32_t>>>();
    for (size_t i = 0; i < texts.size(); ++i) CHECK(tok.encode(texts[i]) == prompts[i]);
    const json& gen = c.at("generate");
    const auto seqs = gen.at("sequences").get<std::vector<std::vector<int32_t>>>();
    const auto news = gen.at("new_tokens").get<std::vector<std::vector<int32_t>>>();
    CHECK(tok.decode_batch(seqs, {true, true}) == gen.at("decoded").get<std::vector<std::string>>());
    CHECK(tok.decode_batch(news, {true, true}) == gen.at("decoded_new").get<std::vector<std::string>>());
    rows += static_cast<int>(seqs.size());
  }
  CHECK(rows == 6);
}

TEST_CASE("tokenizer: tokenizer.json (merges as strings and as pairs) encodes like vocab.json + merges.txt") {
  const auto& ref = opt_tok();
  std::vector<std::string> texts;
  for (const json& c : goldens().at("encode")) texts.push_back(c.at("text").get<std::string>());
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng, 60));
  for (bool pairs : {false, true}) {
    for (bool with_template : {false, true}) {
      CAPTURE(pairs);
      CAPTURE(with_template);
      const std::string blob = make_tokenizer_json(pairs, with_template).dump();
      const opt::Tokenizer tok = opt::Tokenizer::from_tokenizer_json(blob);
      CHECK(tok.vocab_size() == ref.vocab_size());
      CHECK(tok.bos_token_id() == 2);
      CHECK(tok.pad_token_id() == 1);
      for (const auto& t : texts) {
        CAPTURE(t);
        REQUIRE(tok.encode(t) == ref.encode(t));
        REQUIRE(tok.encode(t, false) == ref.encode(t, false));
      }
      const std::vector<int32_t> ids = {2, 31414, 232, 2, 1, 1};
      CHECK(tok.decode(ids) == ref.decode(ids));
      CHECK(tok.decode(ids, {true, true}) == ref.decode(ids, {true, true}));
    }
  }
  // from_dir on a folder with only tokenizer.json
  temp_dir dir("tj");
  dir.write("tokenizer.json", make_tokenizer_json(true, true).dump());
  const opt::Tokenizer tok = opt::Tokenizer::from_dir(dir.path);
  for (const auto& t : texts) CHECK(tok.encode(t) == ref.encode(t));
}

TEST_CASE("tokenizer: from_dir reads tokenizer_config.json and special_tokens_map.json") {
  temp_dir dir("cfg");
  dir.write("vocab.json", opt_test::read_text(tok_dir() / "vocab.json"));
  dir.write("merges.txt", opt_test::read_text(tok_dir() / "merges.txt"));
  // facebook/opt-125m's own config files
  const json tok_cfg = goldens().at("tokenizer").at("tokenizer_config");
  dir.write("tokenizer_config.json", tok_cfg.dump());
  dir.write("special_tokens_map.json",
            json{{"bos_token", tok_cfg["bos_token"]}, {"eos_token", tok_cfg["eos_token"]},
                 {"unk_token", tok_cfg["unk_token"]}, {"pad_token", tok_cfg["pad_token"]}}.dump());
  {
    const opt::Tokenizer tok = opt::Tokenizer::from_dir(dir.path);
    for (const json& c : goldens().at("encode")) CHECK(tok.encode(c.at("text").get<std::string>()) == ids_of(c.at("ids")));
  }
  // settings that differ: no BOS, a prefix space, <mask> as an extra special token
  dir.write("tokenizer_config.json", R"({"add_bos_token": false, "add_prefix_space": true, "pad_token": "<pad>"})");
  dir.write("special_tokens_map.json", R"({"mask_token": {"content": "<mask>"}, "eos_token": "</s>"})");
  const opt::Tokenizer tok = opt::Tokenizer::from_dir(dir.path);
  CHECK(tok.encode("Hello world") == std::vector<int32_t>{20920, 232});  // "ĠHello", "Ġworld"
  CHECK(tok.encode("a<mask>b") == std::vector<int32_t>{10, 50264, 428});
  CHECK(tok.is_special(50264));
  CHECK(tok.decode({20920, 50264, 232}, {true, true}) == " Hello world");
  // a special token the vocabulary lacks gets the next id, as in Hugging Face
  dir.write("special_tokens_map.json", R"({"additional_special_tokens": ["<|new|>"]})");
  const opt::Tokenizer tok2 = opt::Tokenizer::from_dir(dir.path);
  CHECK(tok2.vocab_size() == 50266);
  CHECK(tok2.token_to_id("<|new|>") == 50265);
  CHECK(tok2.encode("x<|new|>") == std::vector<int32_t>{3023, 50265});  // prefix space: " x"
}

TEST_CASE("tokenizer: tokenizer_config.json's clean_up_tokenization_spaces is decode's default") {
  const std::string vocab = opt_test::read_text(tok_dir() / "vocab.json");
  const std::string merges = opt_test::read_text(tok_dir() / "merges.txt");
  const opt::Tokenizer opt_default = opt::Tokenizer::from_blobs(vocab, merges);
  const opt::Tokenizer off = opt::Tokenizer::from_blobs(vocab, merges, R"({"clean_up_tokenization_spaces": false})");
  CHECK(opt_default.clean_up_tokenization_spaces());
  CHECK_FALSE(off.clean_up_tokenization_spaces());
  const std::vector<int32_t> ids = opt_default.encode("Hello . I do n't know ,", false);
  CHECK(opt_default.decode(ids) == "Hello. I don't know,");  // as transformers 4.36 without the key
  CHECK(off.decode(ids) == "Hello . I do n't know ,");
  opt::DecodeOptions on;
  on.clean_up_tokenization_spaces = true;  // an explicit option wins over the file
  CHECK(off.decode(ids, on) == "Hello. I don't know,");
  // the streaming decoder follows the same default
  opt::StreamDecoder sd(off);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  CHECK(streamed + sd.flush() == "Hello . I do n't know ,");
  CHECK_THROWS_AS(opt::Tokenizer::from_blobs(vocab, merges, R"({"clean_up_tokenization_spaces": "no"})"),
                  opt::format_error);
}

TEST_CASE("tokenizer: pre-tokenizer pieces follow Python's regex") {
  using v = std::vector<std::string>;
  CHECK(pieces("Hello world") == v{"Hello", " world"});
  CHECK(pieces("a  b") == v{"a", " ", " b"});
  CHECK(pieces("a   b    c") == v{"a", "  ", " b", "   ", " c"});
  CHECK(pieces("trailing  ") == v{"trailing", "  "});
  CHECK(pieces("\n\nx") == v{"\n", "\n", "x"});
  CHECK(pieces("x \n y") == v{"x", " \n", " y"});
  CHECK(pieces("I'm don't y'all'd've") == v{"I", "'m", " don", "'t", " y", "'", "all", "'d", "'ve"});
  CHECK(pieces("DON'T ''s") == v{"DON", "'", "T", " ''", "s"});
  CHECK(pieces("3.14 x2 ²³") == v{"3", ".", "14", " x", "2", " ²³"});
  CHECK(pieces("a\xC2\xA0" "b") == v{"a", "\xC2\xA0", "b"});                 // NBSP is \s
  CHECK(pieces("a\xE2\x80\x8B" "b") == v{"a", "\xE2\x80\x8B", "b"});         // ZWSP is not
  CHECK(pieces("a\x1C" "b") == v{"a", "\x1C", "b"});                         // U+001C is not \s for `regex`
  CHECK(pieces("e\xCC\x81t") == v{"e", "\xCC\x81", "t"});                    // combining mark: other
  CHECK(pieces("?! ...") == v{"?!", " ..."});
  CHECK(pieces("").empty());
  // invalid UTF-8: each bad byte is an "other" character
  CHECK(pieces("a\x80\xFF b") == v{"a", "\x80\xFF", " b"});
  CHECK(pieces(" \xE2\x82") == v{" \xE2\x82"});
  CHECK(pieces("x\xF0\x9F\xA4") == v{"x", "\xF0\x9F\xA4"});
}

TEST_CASE("tokenizer: invalid UTF-8 input has defined results") {
  const auto& tok = opt_tok();
  const std::vector<std::string> bad = {"\xFF", "\xFF\xFE", "a\x80" "b", "\xC3", "\xC3" "A", "\xC0\xAF",
                                        "\xED\xA0\x80", "\xF4\x90\x80\x80", "caf\xE9", "\xF0\x9F\xA4", "x\xF0\x9F\xA4 y",
                                        std::string("nul\0byte", 8)};
  for (const auto& s : bad) {
    CAPTURE(s);
    const auto ids = tok.encode(s, false);
    std::string raw;
    for (int32_t id : ids) raw += std::string(tok.id_to_bytes(id));
    CHECK(raw == s);                                    // every byte kept
    CHECK(tok.decode(ids, {true, false}) == py_replace(s));  // and repaired like Python on decode
  }
  CHECK(tok.encode("\xFF", false) == std::vector<int32_t>{50107});  // the byte token of 0xFF ("ÿ")
  CHECK(tok.decode(tok.encode("\xFF\xFE", false)) == "\xEF\xBF\xBD\xEF\xBF\xBD");
  // random bytes never crash and always round-trip at the byte level
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const auto ids = tok.encode(s);
    std::string raw;
    for (size_t k = 1; k < ids.size(); ++k) raw += std::string(tok.id_to_bytes(ids[k]));
    CHECK(raw == s);
    CHECK(valid_utf8(tok.decode(ids)));
  }
}

TEST_CASE("tokenizer: property: decode(encode(s)) == s for random valid UTF-8 (no cleanup, skip special)") {
  const auto& tok = opt_tok();
  std::mt19937 rng(20240229);
  int n = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = random_text(rng, i < 2900 ? 40 : 2000);
    REQUIRE(valid_utf8(s));
    if (s.find("</s>") != std::string::npos || s.find("<pad>") != std::string::npos) continue;
    CAPTURE(s);
    const auto ids = tok.encode(s);
    REQUIRE(!ids.empty());
    CHECK(ids[0] == 2);
    CHECK(tok.decode(ids, {true, false}) == s);
    ++n;
  }
  CHECK(n > 2900);
}

TEST_CASE("tokenizer: property: token_to_id(id_to_token(i)) == i for every id") {
  const auto& tok = opt_tok();
  size_t bad = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(tok.vocab_size()); ++i)
    if (tok.token_to_id(tok.id_to_token(i)) != i) ++bad;
  CHECK(bad == 0);
  CHECK(tok.token_to_id("Ġworld") == 232);
  CHECK(!tok.token_to_id("no such token").has_value());
}

TEST_CASE("tokenizer: BPE merge loop: heap version equals the naive reference") {
  // The rank table from the real files, over raw byte strings (ids = position in a local vocabulary).
  const json vocab = opt_test::read_json(tok_dir() / "vocab.json");
  std::unordered_map<std::string, int32_t> ids;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) ids[it.key()] = it.value().get<int32_t>();
  opt::detail::merge_table merges;
  const std::string txt = opt_test::read_text(tok_dir() / "merges.txt");
  size_t pos = txt.find('\n') + 1;
  int32_t rank = 0;
  while (pos < txt.size()) {
    size_t eol = txt.find('\n', pos);
    if (eol == std::string::npos) eol = txt.size();
    const std::string line = txt.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    merges.set(ids.at(a), ids.at(b), {rank++, ids.at(a + b)});
  }
  std::mt19937 rng(3);
  const std::string alphabet = "aabcdeeinorst  ";
  for (int i = 0; i < 500; ++i) {
    std::string w;
    const size_t n = 1 + rng() % 300;
    for (size_t k = 0; k < n; ++k) w += (i % 3 == 0) ? "ab"[rng() % 2] : alphabet[rng() % alphabet.size()];
    std::vector<int32_t> a;
    for (unsigned char c : w) a.push_back(ids.at(opt::detail::bytes_to_byte_level(std::string(1, static_cast<char>(c)))));
    std::vector<int32_t> b = a;
    opt::detail::bpe_merge_naive(merges, a);
    opt::detail::bpe_merge_heap(merges, b);
    CAPTURE(w);
    REQUIRE(a == b);
  }
  // a very long word stays fast (heap path) and exact
  const auto& tok = opt_tok();
  const std::string long_word(200000, 'a');
  const auto long_ids = tok.encode(long_word, false);
  CHECK(tok.decode(long_ids) == long_word);
}

TEST_CASE("tokenizer: StreamDecoder pieces are valid UTF-8 and concatenate to decode") {
  const auto& tok = opt_tok();
  std::mt19937 rng(5);
  // id pools: ordinary words, byte tokens (split UTF-8), specials, cleanup triggers
  std::vector<int32_t> pool;
  for (const json& c : goldens().at("encode"))
    for (int32_t id : ids_of(c.at("ids"))) pool.push_back(id);
  for (int32_t id : {1, 2, 6569, 10470, 6800, 43998, 7471, 3849, 15375, 49585, 4333, 50107, 2156, 479, 128, 29, 75,
                     295, 17487, 27785, 1437, 4, 6, 0, 3, 50264})
    pool.push_back(id);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int32_t> ids(rng() % 30);
    for (auto& id : ids) id = pool[rng() % pool.size()];
    for (bool skip : {false, true}) {
      for (bool cleanup : {false, true}) {
        const opt::DecodeOptions o{skip, cleanup};
        opt::StreamDecoder sd(tok, o);
        std::string all;
        for (int32_t id : ids) {
          const std::string piece = sd.push(id);
          CHECK(valid_utf8(piece));
          all += piece;
        }
        const std::string tail = sd.flush();
        CHECK(valid_utf8(tail));
        all += tail;
        CAPTURE(skip);
        CAPTURE(cleanup);
        REQUIRE(all == tok.decode(ids, o));
      }
    }
  }
  // text appears as soon as it is final
  opt::StreamDecoder sd(tok, {true, false});
  CHECK(sd.push(31414) == "Hello");
  CHECK(sd.push(6569).empty());  // first bytes of an emoji
  CHECK(sd.push(10470).empty());
  CHECK(sd.push(6800) == "\xF0\x9F\xA4\x97");
  CHECK(sd.flush().empty());
  CHECK_THROWS_AS(sd.push(50270), opt::tokenizer_error);
}

TEST_CASE("tokenizer: malformed files give opt::error naming file, line or key") {
  const std::string merges = "#version: 0.2\na b\n";
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2})";
  CHECK(opt::Tokenizer::from_blobs(vocab, merges).encode("ab", false) == std::vector<int32_t>{2});

  CHECK(error_of([&] { opt::Tokenizer::from_blobs(R"({"a": 0, "b": 1, "ab": "x"})", merges); }) ==
        "[opt.format] vocab.json line 1: key \"ab\": expected an integer token id, found \"x\"");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs("{\"a\": 0,\n \"b\": 1,\n \"ab\": 1}", merges); }) ==
        "[opt.format] vocab.json line 3: key \"ab\": token id 1 is already used by \"b\"");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs(R"({"a": 0, "b": -4})", merges); })
            .rfind("[opt.format] vocab.json line 1: key \"b\": token id -4 is out of range", 0) == 0);
  CHECK(error_of([&] { opt::Tokenizer::from_blobs("{\"a\": 0,\n \"b\": 1,\n", merges); })
            .rfind("[opt.format] vocab.json", 0) == 0);
  CHECK(error_of([&] { opt::Tokenizer::from_blobs("[1, 2]", merges); }).rfind("[opt.format] vocab.json", 0) == 0);
  CHECK(error_of([&] { opt::Tokenizer::from_blobs("{}", merges); }) == "[opt.format] vocab.json: the vocabulary is empty");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs(vocab, "#version: 0.2\na b\nab\n"); }) ==
        "[opt.format] merges.txt line 3: expected two tokens separated by one space, found \"ab\"");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs(vocab, "a  b\n"); }) ==
        "[opt.format] merges.txt line 1: expected two tokens separated by one space, found \"a  b\"");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs(vocab, "a b\nb c\n"); }) ==
        "[opt.format] merges.txt line 2: token \"c\" is not in the vocabulary");
  CHECK(error_of([&] { opt::Tokenizer::from_blobs(vocab, "b a\n"); }) ==
        "[opt.format] merges.txt line 1: merge result \"ba\" is not in the vocabulary");

  CHECK(error_of([&] { opt::Tokenizer::from_tokenizer_json(R"({"version": "1.0"})"); }) ==
        "[opt.format] tokenizer.json: missing key \"model\"");
  CHECK(error_of([&] { opt::Tokenizer::from_tokenizer_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"); }) ==
        "[opt.tokenizer] tokenizer.json: model.type is \"WordPiece\", only \"BPE\" is supported");
  CHECK(error_of([&] {
          opt::Tokenizer::from_tokenizer_json(
              R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", ["a"]]}})");
        }) == "[opt.format] tokenizer.json model.merges[1]: expected a pair of strings, found 1 elements");
  CHECK(error_of([&] {
          opt::Tokenizer::from_tokenizer_json(
              R"({"pre_tokenizer": {"type": "Whitespace"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
        }).rfind("[opt.tokenizer] tokenizer.json: pre_tokenizer {\"type\":\"Whitespace\"} is not supported", 0) == 0);
  CHECK(error_of([&] { opt::Tokenizer::from_tokenizer_json("{\"model\": {\"vocab\": {\"a\": 0,}}}"); })
            .rfind("[opt.format] tokenizer.json", 0) == 0);

  temp_dir dir("bad");
  CHECK(error_of([&] { opt::Tokenizer::from_dir(dir.path / "nope"); }) ==
        "[opt.io] tokenizer folder " + (dir.path / "nope").string() + " does not exist");
  CHECK(error_of([&] { opt::Tokenizer::from_dir(dir.path); }) ==
        "[opt.io] " + dir.path.string() + ": no tokenizer files (expected vocab.json and merges.txt, or tokenizer.json)");
  dir.write("vocab.json", vocab);
  dir.write("merges.txt", merges);
  dir.write("tokenizer_config.json", R"({"add_bos_token": "yes"})");
  CHECK(error_of([&] { opt::Tokenizer::from_dir(dir.path); }) ==
        "[opt.format] " + (dir.path / "tokenizer_config.json").string() +
            ": key \"add_bos_token\": expected true or false, found \"yes\"");
  dir.write("tokenizer_config.json", "{not json");
  CHECK(error_of([&] { opt::Tokenizer::from_dir(dir.path); })
            .rfind("[opt.format] " + (dir.path / "tokenizer_config.json").string() + ": invalid JSON", 0) == 0);
  CHECK(error_of([&] { opt::Tokenizer::from_files(dir.path / "missing.json", dir.path / "merges.txt"); }) ==
        "[opt.io] cannot open " + (dir.path / "missing.json").string());
  dir.write("merges.txt", "#version: 0.2\na b\nb\n");
  CHECK(error_of([&] { opt::Tokenizer::from_dir(dir.path); }) ==
        "[opt.format] " + (dir.path / "merges.txt").string() +
            " line 3: expected two tokens separated by one space, found \"b\"");
}
