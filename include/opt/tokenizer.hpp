// opt::Tokenizer: byte-level BPE identical to Hugging Face's GPT2Tokenizer with facebook/opt-125m's settings
// (transformers 4.36), built as HF builds it: added tokens -> GPT-2 pre-tokenizer -> BPE by merge rank ->
// byte decoder. Factories take blobs; the path factories are thin wrappers.
//
//   auto tok = opt::Tokenizer::from_dir("opt-125m/");   // vocab.json + merges.txt (+ configs), or tokenizer.json
//   std::vector<int32_t> ids = tok.encode("Hello world");   // {2, 31414, 232}: BOS </s> prepended
//   std::string text = tok.decode(ids, {/*skip_special_tokens=*/true});   // "Hello world"
//
// Defined behaviour at the edges:
// - Invalid UTF-8 in encode: accepted. Each byte that does not start a complete, well-formed UTF-8 sequence is a
//   character of its own, in the pre-tokenizer's "other" class (like punctuation), and byte-level BPE encodes its
//   byte as is. No byte is dropped or replaced, so decode(encode(s)) returns s with each such byte turned into
//   U+FFFD (decode always repairs like Python's errors="replace").
// - Ids the tokenizer lacks (negative, >= vocab_size(), e.g. 50265..50271 which OPT's embedding has but its
//   tokenizer does not): decode, decode_batch, id_to_token and StreamDecoder::push throw opt::tokenizer_error
//   naming the id and the valid range. Hugging Face raises too (a TypeError in convert_tokens_to_string).
// - Thread safety: a Tokenizer is immutable after loading except for its BPE cache, which is sharded and
//   mutex-protected, so one Tokenizer (and its copies, which share data and cache) may encode from many threads.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <simdjson.h>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opt/error.hpp"
#include "opt/tokenizer/added_tokens.hpp"
#include "opt/tokenizer/bpe.hpp"
#include "opt/tokenizer/byte_unicode.hpp"
#include "opt/tokenizer/pretokenize.hpp"
#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

// Which side encode_batch pads. Hugging Face's OPT tokenizer pads on the right by default; generation wants left.
enum class PaddingSide { left, right };

struct EncodeOptions {
  bool add_bos = true;  // HF add_special_tokens: prepend BOS (or a tokenizer.json template's tokens)
  PaddingSide padding_side = PaddingSide::right;  // HF default for facebook/opt-*
  size_t max_length = 0;    // 0: no limit
  bool truncation = true;   // with max_length > 0: true keeps the first max_length ids (HF truncation_side
                            // "right"); false throws opt::input_error for a longer row
  bool padding = true;      // pad every row to the longest row with pad_token_id(), mask 0
};

struct BatchEncoding {
  std::vector<std::vector<int32_t>> input_ids;
  std::vector<std::vector<int32_t>> attention_mask;  // 1 for tokens, 0 for padding
};

struct DecodeOptions {
  bool skip_special_tokens = false;          // HF default; removes bos/eos/unk/pad (for OPT: ids 1 and 2 only)
  // " ." -> ".", " n't" -> "n't", ...; unset: the tokenizer's default (Tokenizer::clean_up_tokenization_spaces():
  // tokenizer_config.json's "clean_up_tokenization_spaces", else true as in transformers 4.36)
  std::optional<bool> clean_up_tokenization_spaces;
};

namespace detail {

inline std::string read_file(const std::filesystem::path& p) {
  std::error_code ec;  // a directory, FIFO or device would fail late, block or never end: regular files only
  if (std::filesystem::exists(p, ec) && !std::filesystem::is_regular_file(p, ec))
    throw io_error(p.string() + ": not a regular file");
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) throw io_error("cannot open " + p.string());
  const std::streamoff size = f.tellg();
  if (size < 0) throw io_error("cannot read " + p.string());
  std::string s(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (!f.read(s.data(), size)) throw io_error("cannot read " + p.string());
  return s;
}

inline std::string quote_for_error(std::string_view s, size_t max = 60) {
  std::string out = "\"";
  out.append(s.substr(0, max));
  if (s.size() > max) out += "...";
  return out + "\"";
}

inline size_t line_at(std::string_view blob, const char* where) {
  if (!where || where < blob.data() || where > blob.data() + blob.size()) return 0;
  return 1 + static_cast<size_t>(std::count(blob.data(), where, '\n'));
}

// Python's str.replace applied in the order of transformers' clean_up_tokenization.
inline std::string clean_up_tokenization(std::string s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  if (s.find(' ') == std::string::npos) return s;
  std::string out;
  for (const auto& [from, to] : kRules) {
    size_t pos = s.find(from);
    if (pos == std::string::npos) continue;
    out.clear();
    size_t start = 0;
    while (pos != std::string::npos) {
      out.append(s, start, pos - start);
      out.append(to);
      start = pos + from.size();
      pos = s.find(from, start);
    }
    out.append(s, start, std::string::npos);
    s.swap(out);
  }
  return s;
}

// Everything a Tokenizer knows, immutable once built.
struct tokenizer_data {
  std::vector<std::string> tokens;   // id -> token string in the byte-level alphabet (as in vocab.json)
  std::vector<uint8_t> present;      // id has a token
  std::unordered_map<std::string, int32_t> by_token;
  std::string bytes_blob;            // id -> decoded bytes, at bytes_off[id] .. bytes_off[id + 1]
  std::vector<uint32_t> bytes_off;
  std::vector<uint8_t> special;      // removed by skip_special_tokens
  merge_table merges;
  int32_t byte_ids[256] = {};        // id of each single byte's token, -1 if the vocabulary lacks it
  added_token_matcher added;
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  std::vector<int32_t> prefix, suffix;  // added by encode(add_bos = true)
  enum class prefix_space { none, whole_text, each_chunk } add_prefix_space = prefix_space::none;
  bool clean_up_default = true;      // tokenizer_config.json's clean_up_tokenization_spaces (HF 4.36: true)

  size_t size() const noexcept { return tokens.size(); }
  bool has(int32_t id) const noexcept { return id >= 0 && static_cast<size_t>(id) < tokens.size() && present[id]; }
  std::string_view bytes(int32_t id) const noexcept {
    return std::string_view(bytes_blob).substr(bytes_off[id], bytes_off[id + 1] - bytes_off[id]);
  }
};

// Collects vocabulary, merges and settings from the files, then build() freezes them.
class tokenizer_builder {
 public:
  // ---- vocabulary ------------------------------------------------------------------------------------------
  // `where` is called only to build an error message (file and line or key).
  template <class Where>
  void set_token(int64_t id, std::string_view tok, Where&& where) {
    if (id < 0 || id > kMaxId)
      throw format_error(where() + ": key " + quote_for_error(tok) + ": token id " + std::to_string(id) +
                         " is out of range (expected 0.." + std::to_string(kMaxId) + ")");
    const size_t i = static_cast<size_t>(id);
    if (i >= d_->tokens.size()) {
      d_->tokens.resize(std::max(i + 1, d_->tokens.size() * 3 / 2));
      d_->present.resize(d_->tokens.size(), 0);
    }
    if (d_->present[i])
      throw format_error(where() + ": key " + quote_for_error(tok) + ": token id " + std::to_string(id) +
                         " is already used by " + quote_for_error(d_->tokens[i]));
    auto [it, fresh] = d_->by_token.emplace(std::string(tok), static_cast<int32_t>(id));
    if (!fresh) throw format_error(where() + ": key " + quote_for_error(tok) + " appears twice");
    d_->tokens[i] = it->first;
    d_->present[i] = 1;
    max_id_ = std::max(max_id_, static_cast<int32_t>(id));
  }
  void set_token_at(int64_t id, std::string_view tok, const std::string& where) {
    set_token(id, tok, [&] { return where; });
  }

  // vocab.json: one object {token: id}. Also the "vocab" object of tokenizer.json (via parse_vocab_object).
  void parse_vocab_json(std::string_view blob, const std::string& source) {
    simdjson::padded_string padded(blob);
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    d_->by_token.reserve(blob.size() / 16);  // about one entry per 16 bytes of vocab.json
    bool iterating = false;  // a document that failed to start has no location (asking it reads a null pointer)
    try {
      doc = parser.iterate(padded);
      iterating = true;
      simdjson::ondemand::object obj = doc.get_object();
      parse_vocab_object(obj, source, padded, doc);
    } catch (const simdjson::simdjson_error& e) {
      throw format_error(source + (iterating ? where_line(padded, location(doc)) : std::string()) +
                         ": invalid JSON: " + e.what());
    }
    if (d_->by_token.empty()) throw format_error(source + ": the vocabulary is empty");
  }

  template <class Object, class Doc>
  void parse_vocab_object(Object& obj, const std::string& source, const simdjson::padded_string& padded, Doc& doc) {
    for (auto field : obj) {
      std::string_view key = field.unescaped_key();
      auto value = field.value();
      int64_t id = 0;
      if (value.get_int64().get(id) != simdjson::SUCCESS) {
        const char* loc = location(doc);
        std::string_view raw;
        if (value.raw_json_token().get(raw) != simdjson::SUCCESS) raw = "?";
        throw format_error(source + where_line(padded, loc) + ": key " + quote_for_error(key) +
                           ": expected an integer token id, found " + std::string(raw.substr(0, 40)));
      }
      set_token(id, key, [&] {
        return source + where_line(padded, location(doc));
      });
    }
  }

  // ---- merges -------------------------------------------------------------------------------------------------
  int32_t require(std::string_view tok, const std::string& where) const {
    auto it = d_->by_token.find(std::string(tok));
    if (it == d_->by_token.end()) throw format_error(where + ": token " + quote_for_error(tok) + " is not in the vocabulary");
    return it->second;
  }
  void add_merge(std::string_view a, std::string_view b, const std::string& where) {
    const int32_t ia = require(a, where), ib = require(b, where);
    std::string ab(a);
    ab.append(b);
    auto it = d_->by_token.find(ab);
    if (it == d_->by_token.end())
      throw format_error(where + ": merge result " + quote_for_error(ab) + " is not in the vocabulary");
    d_->merges.set(ia, ib, {rank_++, it->second});
  }

  // merges.txt: an optional "#version" first line, then one "left right" pair per line, best first.
  void parse_merges_txt(std::string_view blob, const std::string& source) {
    d_->merges.reserve(static_cast<size_t>(std::count(blob.begin(), blob.end(), '\n')) + 1);
    size_t line_no = 0, pos = 0;
    while (pos < blob.size()) {
      size_t eol = blob.find('\n', pos);
      if (eol == std::string_view::npos) eol = blob.size();
      std::string_view line = blob.substr(pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      if (line_no == 1 && line.substr(0, 8) == "#version") continue;
      const size_t sp = line.find(' ');
      if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string_view::npos)
        throw format_error(source + " line " + std::to_string(line_no) +
                           ": expected two tokens separated by one space, found " + quote_for_error(line));
      add_merge(line.substr(0, sp), line.substr(sp + 1), source + " line " + std::to_string(line_no));
    }
  }

  // ---- tokenizer.json ---------------------------------------------------------------------------------------
  void parse_tokenizer_json(std::string_view blob, const std::string& source) {
    simdjson::padded_string padded(blob);
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::string> merge_where;
    bool have_model = false, have_vocab = false;
    nlohmann::json added_tokens, pre_tokenizer, post_processor, normalizer, decoder;
    bool iterating = false;  // as in parse_vocab_json
    try {
      doc = parser.iterate(padded);
      iterating = true;
      simdjson::ondemand::object root = doc.get_object();
      for (auto field : root) {
        std::string_view key = field.unescaped_key();
        auto value = field.value();
        if (key == "model") {
          have_model = true;
          simdjson::ondemand::object model = value.get_object();
          for (auto mf : model) {
            std::string_view mkey = mf.unescaped_key();
            auto mv = mf.value();
            if (mkey == "vocab") {
              d_->by_token.reserve(blob.size() / 32);  // the vocabulary is about half of tokenizer.json
              simdjson::ondemand::object vocab = mv.get_object();
              parse_vocab_object(vocab, source + " model.vocab", padded, doc);
              have_vocab = true;
            } else if (mkey == "merges") {
              simdjson::ondemand::array arr = mv.get_array();
              size_t idx = 0;
              for (auto item : arr) {
                const std::string where = source + " model.merges[" + std::to_string(idx++) + "]";
                simdjson::ondemand::json_type t = item.type();
                if (t == simdjson::ondemand::json_type::string) {
                  std::string_view s = item.get_string();
                  const size_t sp = s.find(' ');
                  if (sp == 0 || sp == std::string_view::npos || sp + 1 == s.size() ||
                      s.find(' ', sp + 1) != std::string_view::npos)
                    throw format_error(where + ": expected \"left right\", found " + quote_for_error(s));
                  merges.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
                } else if (t == simdjson::ondemand::json_type::array) {
                  std::vector<std::string> parts;
                  for (auto part : item.get_array()) {
                    std::string_view ps;
                    if (part.get_string().get(ps) != simdjson::SUCCESS)
                      throw format_error(where + ": expected a pair of strings");
                    parts.emplace_back(ps);
                  }
                  if (parts.size() != 2)
                    throw format_error(where + ": expected a pair of strings, found " + std::to_string(parts.size()) +
                                       " elements");
                  merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
                } else {
                  throw format_error(where + ": expected a string \"left right\" or a pair [\"left\", \"right\"]");
                }
                merge_where.push_back(where);
              }
            } else if (mkey == "type") {
              std::string_view type = mv.get_string();
              if (type != "BPE")
                throw tokenizer_error(source + ": model.type is " + quote_for_error(type) + ", only \"BPE\" is supported");
            } else if (mkey == "continuing_subword_prefix" || mkey == "end_of_word_suffix") {
              std::string_view s;
              if (!mv.is_null() && mv.get_string().get(s) == simdjson::SUCCESS && !s.empty())
                throw tokenizer_error(source + ": model." + std::string(mkey) + " " + quote_for_error(s) + " is not supported");
            } else if (mkey == "byte_fallback") {
              bool b = false;
              if (mv.get_bool().get(b) == simdjson::SUCCESS && b)
                throw tokenizer_error(source + ": model.byte_fallback = true is not supported");
            }
          }
        } else if (key == "added_tokens" || key == "pre_tokenizer" || key == "post_processor" ||
                   key == "normalizer" || key == "decoder") {
          nlohmann::json j;  // small: hand over to nlohmann
          const simdjson::ondemand::json_type t = value.type();
          if (t == simdjson::ondemand::json_type::object) {
            simdjson::ondemand::object o = value.get_object();
            j = nlohmann::json::parse(std::string_view(o.raw_json()));
          } else if (t == simdjson::ondemand::json_type::array) {
            simdjson::ondemand::array a = value.get_array();
            j = nlohmann::json::parse(std::string_view(a.raw_json()));
          } else if (t != simdjson::ondemand::json_type::null) {
            j = nlohmann::json::parse(std::string_view(value.raw_json_token()));
          }
          if (key == "added_tokens") added_tokens = std::move(j);
          if (key == "pre_tokenizer") pre_tokenizer = std::move(j);
          if (key == "post_processor") post_processor = std::move(j);
          if (key == "normalizer") normalizer = std::move(j);
          if (key == "decoder") decoder = std::move(j);
        }
      }
    } catch (const simdjson::simdjson_error& e) {
      throw format_error(source + (iterating ? where_line(padded, location(doc)) : std::string()) +
                         ": invalid JSON: " + e.what());
    } catch (const nlohmann::json::exception& e) {
      throw format_error(source + ": invalid JSON: " + e.what());
    }
    if (!have_model) throw format_error(source + ": missing key \"model\"");
    if (!have_vocab) throw format_error(source + ": missing key \"model.vocab\"");
    d_->merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) add_merge(merges[i].first, merges[i].second, merge_where[i]);

    if (!normalizer.is_null())
      throw tokenizer_error(source + ": normalizer " + normalizer.dump().substr(0, 60) + " is not supported (expected null)");
    check_byte_level(pre_tokenizer, source, "pre_tokenizer");
    if (!decoder.is_null()) check_byte_level(decoder, source, "decoder");
    try {
      if (added_tokens.is_array()) {
        for (const auto& t : added_tokens) {
          added_token a;
          a.content = t.at("content").get<std::string>();
          // an integer in [0, kMaxId]: get<int32_t>() would wrap 2^32 + 2 to 2, and cast 1e22 (undefined)
          const nlohmann::json& id = t.at("id");
          if (!id.is_number_integer() || (id.is_number_unsigned() ? id.get<uint64_t>() > uint64_t(kMaxId)
                                                                   : (id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId)))
            throw format_error(source + " added_tokens: token " + quote_for_error(a.content) + " has id " +
                               id.dump().substr(0, 40) + ", expected an integer in [0, " + std::to_string(kMaxId) + "]");
          a.id = static_cast<int32_t>(id.get<int64_t>());
          a.special = t.value("special", false);
          a.lstrip = t.value("lstrip", false);
          a.rstrip = t.value("rstrip", false);
          add_added_token(a, source + " added_tokens");
        }
      }
      if (post_processor.is_object()) parse_post_processor(post_processor, source);
    } catch (const nlohmann::json::exception& e) {
      throw format_error(source + ": added_tokens / post_processor: " + e.what());
    }
    tokenizer_json_ = true;
  }

  // ---- tokenizer_config.json / special_tokens_map.json ------------------------------------------------------
  // Any JSON value of any type in these files gives an opt::error: a type nlohmann rejects becomes a format_error.
  void apply_config(std::string_view blob, const std::string& source) {
    try {
      apply_config_json(blob, source);
    } catch (const nlohmann::json::exception& e) {
      throw format_error(source + ": " + e.what());
    }
  }

  void apply_config_json(std::string_view blob, const std::string& source) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(blob);
    } catch (const nlohmann::json::exception& e) {
      throw format_error(source + ": invalid JSON: " + e.what());
    }
    if (!j.is_object()) throw format_error(source + ": expected a JSON object, found " + j.type_name());
    auto boolean = [&](const char* key, bool& out) {
      if (!j.contains(key) || j[key].is_null()) return;
      if (!j[key].is_boolean())
        throw format_error(source + ": key \"" + key + "\": expected true or false, found " + j[key].dump());
      out = j[key].get<bool>();
    };
    std::optional<bool> add_bos;
    if (j.contains("add_bos_token")) {
      bool b = true;
      boolean("add_bos_token", b);
      add_bos = b;
    }
    if (add_bos) add_bos_token_ = *add_bos;
    boolean("clean_up_tokenization_spaces", d_->clean_up_default);
    bool aps = false;
    if (j.contains("add_prefix_space")) {
      boolean("add_prefix_space", aps);
      add_prefix_space_ = aps;
    }
    if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object()) {
      for (const auto& [k, t] : j["added_tokens_decoder"].items()) {
        added_token a;
        try {
          // the key is the id: digits only, within the ids a tokenizer may have (no silent wrap to int32)
          if (k.empty() || k.size() > 9 || k.find_first_not_of("0123456789") != std::string::npos)
            throw std::invalid_argument("expected a token id (decimal digits, at most " + std::to_string(kMaxId) + ")");
          a.id = static_cast<int32_t>(std::stoll(k));
          a.content = t.at("content").get<std::string>();
          a.special = t.value("special", false);
          a.lstrip = t.value("lstrip", false);
          a.rstrip = t.value("rstrip", false);
        } catch (const std::exception& e) {
          throw format_error(source + ": key \"added_tokens_decoder\" entry \"" + k + "\": " + e.what());
        }
        add_added_token(a, source + " added_tokens_decoder");
      }
    }
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
      if (!j.contains(key)) continue;
      const nlohmann::json& v = j[key];
      std::optional<std::string> content;
      if (v.is_string()) {
        content = v.get<std::string>();
      } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
        content = v["content"].get<std::string>();
      } else if (!v.is_null()) {
        throw format_error(source + ": key \"" + key + "\": expected a string, {\"content\": ...} or null, found " +
                           v.dump().substr(0, 60));
      }
      named_[key] = content;
    }
    if (j.contains("additional_special_tokens") && j["additional_special_tokens"].is_array()) {
      for (const auto& v : j["additional_special_tokens"]) {
        if (v.is_string()) extra_special_.push_back(v.get<std::string>());
        else if (v.is_object() && v.contains("content") && v["content"].is_string())
          extra_special_.push_back(v["content"].get<std::string>());
      }
    }
  }

  std::shared_ptr<const tokenizer_data> build() {
    tokenizer_data& d = *d_;
    // The named special tokens; facebook/opt-125m's when no file says otherwise.
    auto content = [&](const char* key, const char* dflt) -> std::optional<std::string> {
      auto it = named_.find(key);
      if (it != named_.end()) return it->second;
      if (dflt && d.by_token.count(dflt)) return std::string(dflt);
      return std::nullopt;
    };
    auto special_id = [&](const std::optional<std::string>& c) -> int32_t {
      if (!c) return -1;
      auto it = d.by_token.find(*c);
      int32_t id;
      if (it == d.by_token.end()) {  // HF adds a special token the vocabulary lacks at the end
        id = max_id_ + 1;
        set_token_at(id, bytes_to_byte_level(*c), "special token " + quote_for_error(*c));
      } else {
        id = it->second;
      }
      added_token a;
      a.content = *c;
      a.id = id;
      a.special = true;
      bool exists = false;
      for (const auto& t : d.added.tokens()) {
        if (t.content == *c) {
          exists = true;
          if (!t.special) {
            a.lstrip = t.lstrip;
            a.rstrip = t.rstrip;
            d.added.add(a);
          }
        }
      }
      if (!exists) d.added.add(a);
      return id;
    };
    d.bos = special_id(content("bos_token", "</s>"));
    d.eos = special_id(content("eos_token", "</s>"));
    d.unk = special_id(content("unk_token", "</s>"));
    d.pad = special_id(content("pad_token", "<pad>"));
    for (const char* key : {"sep_token", "cls_token", "mask_token"}) special_id(content(key, nullptr));
    for (const auto& c : extra_special_) special_id(c);

    d.tokens.resize(static_cast<size_t>(max_id_) + 1);
    d.present.resize(d.tokens.size());
    const size_t n = d.tokens.size();
    d.special.assign(n, 0);
    for (const auto& t : d.added.tokens())
      if (t.special && t.id >= 0 && static_cast<size_t>(t.id) < n) d.special[t.id] = 1;

    // Decoded bytes of every id: added tokens decode to their content, the rest through the byte decoder. A
    // token with a character outside the byte alphabet decodes to its own UTF-8 (as tokenizers' ByteLevel does).
    std::vector<const added_token*> added_by_id(n, nullptr);
    for (const auto& t : d.added.tokens())
      if (t.id >= 0 && static_cast<size_t>(t.id) < n) added_by_id[t.id] = &t;
    d.bytes_off.assign(n + 1, 0);
    d.bytes_blob.clear();
    for (size_t i = 0; i < n; ++i) {
      d.bytes_off[i] = static_cast<uint32_t>(d.bytes_blob.size());
      if (!d.present[i]) continue;
      if (added_by_id[i]) {
        d.bytes_blob += added_by_id[i]->content;
        continue;
      }
      const std::string& tok = d.tokens[i];
      std::string out;
      const auto* p = reinterpret_cast<const unsigned char*>(tok.data());
      const auto* end = p + tok.size();
      bool ok = true;
      while (p < end) {
        char32_t cp;
        p += utf8_next(p, end, cp);
        if (cp >= 324 || kByteUnicode.cp_to_byte[cp] < 0) {
          ok = false;
          break;
        }
        out += static_cast<char>(kByteUnicode.cp_to_byte[cp]);
      }
      d.bytes_blob += ok ? out : tok;
    }
    d.bytes_off[n] = static_cast<uint32_t>(d.bytes_blob.size());

    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, kByteUnicode.byte_to_cp[b]);
      auto it = d.by_token.find(s);
      d.byte_ids[b] = it == d.by_token.end() ? -1 : it->second;
    }
    if (!prefix_from_template_) {
      d.prefix.clear();
      if (add_bos_token_ && d.bos >= 0) d.prefix.push_back(d.bos);
    }
    if (add_prefix_space_)
      d.add_prefix_space = tokenizer_json_ ? tokenizer_data::prefix_space::each_chunk : tokenizer_data::prefix_space::whole_text;
    return d_;
  }

 private:
  static constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

  template <class Doc>
  static const char* location(Doc& doc) noexcept {
    auto r = doc.current_location();
    return r.error() ? nullptr : r.value_unsafe();
  }
  static std::string where_line(const simdjson::padded_string& padded, const char* loc) {
    const size_t line = line_at(std::string_view(padded.data(), padded.size()), loc);
    return line ? " line " + std::to_string(line) : std::string();
  }

  void add_added_token(const added_token& a, const std::string& where) {
    if (a.id < 0 || a.id > kMaxId)
      throw format_error(where + ": token " + quote_for_error(a.content) + " has id " + std::to_string(a.id) + " out of range");
    const size_t i = static_cast<size_t>(a.id);
    if (i >= d_->tokens.size() || !d_->present[i]) {
      set_token_at(a.id, bytes_to_byte_level(a.content), where);
    }
    d_->added.add(a);
  }

  static void check_byte_level(const nlohmann::json& j, const std::string& source, const char* what) {
    // "type" of an object, "" for anything else (a fuzzed file may hold any JSON value anywhere)
    auto type_of = [](const nlohmann::json& x) -> std::string {
      if (!x.is_object()) return "";
      auto it = x.find("type");
      return it != x.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    auto is_byte_level = [&](const nlohmann::json& x) { return type_of(x) == "ByteLevel"; };
    bool ok = is_byte_level(j);
    if (!ok && type_of(j) == "Sequence") {
      const char* list = std::string(what) == "decoder" ? "decoders" : "pretokenizers";
      ok = j.contains(list) && j[list].is_array() && j[list].size() == 1 && is_byte_level(j[list][0]);
    }
    if (!ok)
      throw tokenizer_error(source + ": " + what + " " + j.dump().substr(0, 80) +
                            " is not supported (expected {\"type\": \"ByteLevel\", ...})");
    const nlohmann::json& bl = is_byte_level(j) ? j : j[std::string(what) == "decoder" ? "decoders" : "pretokenizers"][0];
    if (bl.contains("use_regex") && bl["use_regex"].is_boolean() && !bl["use_regex"].get<bool>())
      throw tokenizer_error(source + ": " + what + ".use_regex = false is not supported");
  }

  void parse_post_processor(const nlohmann::json& pp, const std::string& source) {
    const std::string type = pp.value("type", std::string());
    auto id_of = [&](const std::string& tok) {
      auto it = d_->by_token.find(tok);
      if (it == d_->by_token.end()) {
        for (const auto& t : d_->added.tokens())
          if (t.content == tok) return t.id;
        throw format_error(source + ": post_processor token " + quote_for_error(tok) + " is not in the vocabulary");
      }
      return it->second;
    };
    if (type == "TemplateProcessing") {
      d_->prefix.clear();
      d_->suffix.clear();
      bool seen_a = false;
      for (const auto& piece : pp.at("single")) {
        if (piece.contains("Sequence")) {
          seen_a = true;
        } else if (piece.contains("SpecialToken")) {
          const int32_t id = id_of(piece["SpecialToken"].at("id").get<std::string>());
          (seen_a ? d_->suffix : d_->prefix).push_back(id);
        }
      }
      prefix_from_template_ = true;
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      d_->prefix = {id_of(pp.at("cls").at(0).get<std::string>())};
      d_->suffix = {id_of(pp.at("sep").at(0).get<std::string>())};
      prefix_from_template_ = true;
    } else if (type == "ByteLevel") {
      // offsets only: no tokens added; keep the OPT default (BOS)
    } else {
      throw tokenizer_error(source + ": post_processor type " + quote_for_error(type) + " is not supported");
    }
  }

  std::shared_ptr<tokenizer_data> d_ = std::make_shared<tokenizer_data>();
  int32_t rank_ = 0;
  int32_t max_id_ = -1;
  bool add_bos_token_ = true;
  bool add_prefix_space_ = false;
  bool prefix_from_template_ = false;
  bool tokenizer_json_ = false;
  std::unordered_map<std::string, std::optional<std::string>> named_;
  std::vector<std::string> extra_special_;
};

}  // namespace detail

class StreamDecoder;

class Tokenizer {
 public:
  // A model folder: vocab.json + merges.txt, or tokenizer.json when only that exists; then tokenizer_config.json
  // and special_tokens_map.json (in that order) when present.
  static Tokenizer from_dir(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) throw io_error("tokenizer folder " + dir.string() + " does not exist");
    detail::tokenizer_builder b;
    const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt", tj = dir / "tokenizer.json";
    if (fs::exists(vocab) && fs::exists(merges)) {
      b.parse_vocab_json(detail::read_file(vocab), vocab.string());
      b.parse_merges_txt(detail::read_file(merges), merges.string());
    } else if (fs::exists(tj)) {
      b.parse_tokenizer_json(detail::read_file(tj), tj.string());
    } else {
      throw io_error(dir.string() + ": no tokenizer files (expected vocab.json and merges.txt, or tokenizer.json)");
    }
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
      const fs::path p = dir / name;
      if (fs::exists(p)) b.apply_config(detail::read_file(p), p.string());
    }
    return Tokenizer(b.build());
  }

  static Tokenizer from_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt) {
    detail::tokenizer_builder b;
    b.parse_vocab_json(detail::read_file(vocab_json), vocab_json.string());
    b.parse_merges_txt(detail::read_file(merges_txt), merges_txt.string());
    return Tokenizer(b.build());
  }

  // The contents of vocab.json and merges.txt; facebook/opt-125m's special tokens and settings.
  static Tokenizer from_blobs(std::string_view vocab_json, std::string_view merges_txt) {
    detail::tokenizer_builder b;
    b.parse_vocab_json(vocab_json, "vocab.json");
    b.parse_merges_txt(merges_txt, "merges.txt");
    return Tokenizer(b.build());
  }

  // The same, then the contents of tokenizer_config.json and special_tokens_map.json (an empty view: no such
  // file), applied in that order as from_dir does.
  static Tokenizer from_blobs(std::string_view vocab_json, std::string_view merges_txt,
                              std::string_view tokenizer_config_json, std::string_view special_tokens_map_json = {}) {
    detail::tokenizer_builder b;
    b.parse_vocab_json(vocab_json, "vocab.json");
    b.parse_merges_txt(merges_txt, "merges.txt");
    if (!tokenizer_config_json.empty()) b.apply_config(tokenizer_config_json, "tokenizer_config.json");
    if (!special_tokens_map_json.empty()) b.apply_config(special_tokens_map_json, "special_tokens_map.json");
    return Tokenizer(b.build());
  }

  // The contents of a Hugging Face tokenizer.json (BPE model, merges as "a b" or ["a", "b"], ByteLevel
  // pre-tokenizer and decoder, added_tokens, optional TemplateProcessing / RobertaProcessing post-processor).
  // Without a post-processor that adds tokens, encode(add_bos = true) prepends </s> when the vocabulary has it.
  static Tokenizer from_tokenizer_json(std::string_view blob) {
    detail::tokenizer_builder b;
    b.parse_tokenizer_json(blob, "tokenizer.json");
    return Tokenizer(b.build());
  }

  // ---- encoding ------------------------------------------------------------------------------------------------
  // Text to ids; add_bos = HF's add_special_tokens (for OPT: prepend </s> = 2, append nothing).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = true) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_bos) out = d_->prefix;
    encode_into(text, out);
    if (add_bos) out.insert(out.end(), d_->suffix.begin(), d_->suffix.end());
    return out;
  }

  BatchEncoding encode_batch(const std::vector<std::string>& texts, const EncodeOptions& opts = {}) const {
    BatchEncoding b;
    b.input_ids.reserve(texts.size());
    size_t longest = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids = encode(texts[i], opts.add_bos);
      if (opts.max_length > 0 && ids.size() > opts.max_length) {
        if (!opts.truncation)
          throw input_error("encode_batch: text " + std::to_string(i) + " has " + std::to_string(ids.size()) +
                            " tokens, more than max_length " + std::to_string(opts.max_length) + " (truncation is off)");
        ids.resize(opts.max_length);
      }
      longest = std::max(longest, ids.size());
      b.input_ids.push_back(std::move(ids));
    }
    b.attention_mask.reserve(texts.size());
    for (auto& ids : b.input_ids) {
      const size_t n = ids.size();
      const size_t pad = opts.padding ? longest - n : 0;
      if (pad > 0 && d_->pad < 0)
        throw tokenizer_error("encode_batch: padding needs a pad token, and this tokenizer has none");
      std::vector<int32_t> mask(n, 1);
      if (pad > 0) {
        if (opts.padding_side == PaddingSide::left) {
          ids.insert(ids.begin(), pad, d_->pad);
          mask.insert(mask.begin(), pad, 0);
        } else {
          ids.insert(ids.end(), pad, d_->pad);
          mask.insert(mask.end(), pad, 0);
        }
      }
      b.attention_mask.push_back(std::move(mask));
    }
    return b;
  }

  // ---- decoding ------------------------------------------------------------------------------------------------
  std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& opts = {}) const {
    std::string raw;
    raw.reserve(ids.size() * 4);
    for (int32_t id : ids) {
      check_id(id, "decode");
      if (opts.skip_special_tokens && d_->special[id]) continue;
      raw += d_->bytes(id);
    }
    std::string text;
    text.reserve(raw.size() + 8);
    detail::utf8_repair_append(raw, true, text);
    return clean_up(opts) ? detail::clean_up_tokenization(std::move(text)) : text;
  }

  std::vector<std::string> decode_batch(const std::vector<std::vector<int32_t>>& batch,
                                        const DecodeOptions& opts = {}) const {
    std::vector<std::string> out;
    out.reserve(batch.size());
    for (const auto& ids : batch) out.push_back(decode(ids, opts));
    return out;
  }

  // ---- vocabulary ------------------------------------------------------------------------------------------
  // -1 when the tokenizer has no such token. For OPT: bos = eos = unk = 2, pad = 1.
  int32_t bos_token_id() const noexcept { return d_->bos; }
  int32_t eos_token_id() const noexcept { return d_->eos; }
  int32_t pad_token_id() const noexcept { return d_->pad; }
  int32_t unk_token_id() const noexcept { return d_->unk; }
  // Number of ids (largest id + 1): 50265 for OPT, whose model has 50272 rows.
  size_t vocab_size() const noexcept { return d_->size(); }
  bool is_special(int32_t id) const noexcept { return d_->has(id) && d_->special[id]; }

  // Token strings are in the byte-level alphabet, as in vocab.json ("Ġworld").
  std::optional<int32_t> token_to_id(std::string_view token) const {
    auto it = d_->by_token.find(std::string(token));
    if (it == d_->by_token.end()) return std::nullopt;
    return it->second;
  }
  std::string id_to_token(int32_t id) const {
    check_id(id, "id_to_token");
    return d_->tokens[id];
  }
  // The bytes an id decodes to (before UTF-8 repair); may be part of a multi-byte character.
  std::string_view id_to_bytes(int32_t id) const {
    check_id(id, "id_to_bytes");
    return d_->bytes(id);
  }

  // Whether decode cleans up spaces when DecodeOptions leaves it unset: tokenizer_config.json's
  // "clean_up_tokenization_spaces", true without one (transformers 4.36, facebook/opt-*).
  bool clean_up_tokenization_spaces() const noexcept { return d_->clean_up_default; }
  bool clean_up(const DecodeOptions& o) const noexcept {
    return o.clean_up_tokenization_spaces.value_or(d_->clean_up_default);
  }

  // Empties the BPE cache (benchmarks of cold encoding).
  void clear_cache() const { cache_->clear(); }

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const detail::tokenizer_data> d)
      : d_(std::move(d)), cache_(std::make_shared<detail::bpe_cache>()) {}

  void check_id(int32_t id, const char* what) const {
    if (!d_->has(id))
      throw tokenizer_error(std::string(what) + ": id " + std::to_string(id) + " is not in the tokenizer (valid ids: 0.." +
                            std::to_string(static_cast<long long>(d_->size()) - 1) +
                            "; a model may have more embedding rows than the tokenizer has tokens)");
  }

  void encode_into(std::string_view text, std::vector<int32_t>& out) const {
    using ps = detail::tokenizer_data::prefix_space;
    std::string spaced;
    if (d_->add_prefix_space == ps::whole_text) {
      spaced.reserve(text.size() + 1);
      spaced += ' ';
      spaced.append(text);
      text = spaced;
    }
    d_->added.split(
        text,
        [&](std::string_view chunk) {
          if (d_->add_prefix_space == ps::each_chunk && chunk[0] != ' ') {
            std::string s = " ";
            s.append(chunk);
            encode_plain(s, out);
          } else {
            encode_plain(chunk, out);
          }
        },
        [&](const detail::added_token& t) { out.push_back(t.id); });
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    detail::pretokenize(text, [&](size_t b, size_t e) { encode_word(text.substr(b, e - b), out); });
  }

  void encode_word(std::string_view w, std::vector<int32_t>& out) const {
    if (w.size() == 1) {
      out.push_back(byte_id(static_cast<unsigned char>(w[0])));
      return;
    }
    const uint64_t h = detail::hash_bytes(w);
    if (cache_->lookup(w, h, out)) return;
    thread_local std::vector<int32_t> syms;
    syms.clear();
    for (unsigned char c : w) syms.push_back(d_->byte_ids[c]);
    detail::bpe_merge(d_->merges, syms);
    for (int32_t& id : syms)
      if (id < 0) id = unk_or_throw();
    cache_->insert(w, h, syms.data(), syms.size());
    out.insert(out.end(), syms.begin(), syms.end());
  }

  int32_t byte_id(unsigned char c) const {
    const int32_t id = d_->byte_ids[c];
    return id >= 0 ? id : unk_or_throw();
  }
  int32_t unk_or_throw() const {
    if (d_->unk >= 0) return d_->unk;
    throw tokenizer_error("encode: a byte has no token in the vocabulary and there is no unk token");
  }

  std::shared_ptr<const detail::tokenizer_data> d_;
  std::shared_ptr<detail::bpe_cache> cache_;
};

// Incremental decoding for generation: feed ids one at a time; each push returns the text that is now final.
// Pieces are always whole, valid UTF-8 and concatenate (with flush()) to exactly decode(all ids, opts). Bytes of
// an unfinished UTF-8 character are held back; with clean_up_tokenization_spaces, text is held back until its
// last 3 bytes are not spaces, because the cleanup rules (" .", " n't", ...) look at most 3 bytes past a space.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, DecodeOptions opts = {}) : tok_(tok), opts_(opts) {
    opts_.clean_up_tokenization_spaces = tok.clean_up(opts);
  }

  std::string push(int32_t id) {
    tok_.check_id(id, "StreamDecoder::push");
    if (opts_.skip_special_tokens && tok_.d_->special[id]) return std::string();
    raw_ += tok_.d_->bytes(id);
    raw_.erase(0, detail::utf8_repair_append(raw_, false, text_));
    return take(false);
  }

  // Everything still held back (an unfinished character becomes U+FFFD); the decoder can then be reused.
  std::string flush() {
    detail::utf8_repair_append(raw_, true, text_);
    raw_.clear();
    return take(true);
  }

 private:
  std::string take(bool all) {
    size_t cut = text_.size();
    if (*opts_.clean_up_tokenization_spaces && !all) {
      // The cleanup rules start at a space and span at most 4 bytes, so a cut is safe when none of the 3 bytes
      // before it is a space. Bytes before text_ were emitted under the same rule and are never spaces.
      auto space_at = [&](size_t i, size_t back) { return i >= back && text_[i - back] == ' '; };
      while (cut > 0 && (space_at(cut, 1) || space_at(cut, 2) || space_at(cut, 3) ||
                         (cut < text_.size() && (static_cast<unsigned char>(text_[cut]) & 0xC0) == 0x80)))
        --cut;
    }
    std::string piece = text_.substr(0, cut);
    text_.erase(0, cut);
    return *opts_.clean_up_tokenization_spaces ? detail::clean_up_tokenization(std::move(piece)) : piece;
  }

  Tokenizer tok_;
  DecodeOptions opts_;
  std::string raw_;   // undecoded bytes: an unfinished UTF-8 sequence (at most 3 bytes)
  std::string text_;  // decoded text held back for the cleanup rules
};

OPT_NAMESPACE_END
