// Added tokens (</s>, <pad>, ... and tokenizer.json's added_tokens): found in the text before pre-tokenization
// and emitted as their own id, never split. Matching is leftmost, then longest, like HF's Trie.split.
// lstrip / rstrip remove the whitespace (Python's str.isspace) on that side of a match, as the slow tokenizer
// does. single_word is not supported (treated as false); normalized does not matter (no normalizer).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opt/detail/unicode_tables.hpp"
#include "opt/tokenizer/byte_unicode.hpp"
#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

struct added_token {
  std::string content;
  int32_t id = -1;
  bool special = false;  // removed by decode(skip_special_tokens)
  bool lstrip = false;
  bool rstrip = false;
};

class added_token_matcher {
 public:
  // Adds or replaces (same content) a token.
  void add(const added_token& t) {
    if (t.content.empty()) return;
    for (auto& old : tokens_) {
      if (old.content == t.content) {
        old = t;
        rebuild();
        return;
      }
    }
    tokens_.push_back(t);
    rebuild();
  }
  const std::vector<added_token>& tokens() const noexcept { return tokens_; }
  bool empty() const noexcept { return tokens_.empty(); }

  // Splits text into plain segments and added-token matches: calls plain(string_view) for the text between
  // matches (never empty) and token(const added_token&) for each match, in order.
  template <class Plain, class Token>
  void split(std::string_view text, Plain&& plain, Token&& token) const {
    if (tokens_.empty()) {
      if (!text.empty()) plain(text);
      return;
    }
    size_t start = 0;       // start of the pending plain text
    bool strip_left = false;  // previous match has rstrip: drop leading whitespace of the next plain text
    size_t i = 0;
    while (i < text.size()) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      const added_token* hit = nullptr;
      if (first_byte_[c]) {
        for (const size_t k : order_) {  // longest first
          const std::string& s = tokens_[k].content;
          if (static_cast<unsigned char>(s[0]) == c && text.compare(i, s.size(), s) == 0) {
            hit = &tokens_[k];
            break;
          }
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      std::string_view before = text.substr(start, i - start);
      if (strip_left) before = lstrip(before);
      if (hit->lstrip) before = rstrip(before);
      if (!before.empty()) plain(before);
      token(*hit);
      i += hit->content.size();
      start = i;
      strip_left = hit->rstrip;
    }
    std::string_view rest = text.substr(start);
    if (strip_left) rest = lstrip(rest);
    if (!rest.empty()) plain(rest);
  }

 private:
  void rebuild() {
    std::fill(std::begin(first_byte_), std::end(first_byte_), false);
    order_.clear();
    for (size_t k = 0; k < tokens_.size(); ++k) {
      first_byte_[static_cast<unsigned char>(tokens_[k].content[0])] = true;
      order_.push_back(k);
    }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
  }
  // Python's str.lstrip() / str.rstrip() on UTF-8 (invalid bytes are not whitespace).
  static std::string_view lstrip(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* end = p + s.size();
    while (p < end) {
      char32_t cp;
      const size_t n = utf8_next(p, end, cp);
      if (cp == kInvalidCodePoint || !python_isspace(cp)) break;
      p += n;
    }
    return s.substr(static_cast<size_t>(p - reinterpret_cast<const unsigned char*>(s.data())));
  }
  static std::string_view rstrip(std::string_view s) {
    size_t end = s.size();
    while (end > 0) {
      size_t b = end - 1;  // back up to the start of the last character
      while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
      char32_t cp;
      const auto* p = reinterpret_cast<const unsigned char*>(s.data());
      const size_t n = utf8_next(p + b, p + end, cp);
      if (cp == kInvalidCodePoint || b + n != end || !python_isspace(cp)) break;
      end = b;
    }
    return s.substr(0, end);
  }

  std::vector<added_token> tokens_;
  std::vector<size_t> order_;
  bool first_byte_[256] = {};
};

}  // namespace detail
OPT_NAMESPACE_END
