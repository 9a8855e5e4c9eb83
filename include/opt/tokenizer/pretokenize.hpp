// The GPT-2 pre-tokenizer, written by hand: it splits text exactly as Python's `regex` module splits it with
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (regex.findall; the pieces cover the whole text). \p{L}, \p{N} and \s (White_Space) come from the generated
// tables in opt/detail/unicode_tables.hpp.
//
// Invalid UTF-8: a byte that does not start a complete, well-formed UTF-8 sequence is a character of its own in
// the class [^\s\p{L}\p{N}] (like a symbol), so it joins runs of punctuation. No byte is lost or changed: the
// pieces always concatenate to the input, and byte-level BPE gives every byte a token.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "opt/detail/unicode_tables.hpp"
#include "opt/tokenizer/byte_unicode.hpp"
#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

struct pretok_char {
  char_class cls;
  uint32_t len;  // bytes
};

// ASCII classes, so that the common case needs no table walk.
struct ascii_class_table {
  char_class cls[128] = {};
  constexpr ascii_class_table() {
    for (int c = 0; c < 128; ++c) {
      char_class k = char_class::other;
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k = char_class::letter;
      if (c >= '0' && c <= '9') k = char_class::number;
      if ((c >= 0x09 && c <= 0x0D) || c == ' ') k = char_class::space;
      cls[c] = k;
    }
  }
};
inline constexpr ascii_class_table kAsciiClass{};

inline pretok_char pretok_peek(const unsigned char* p, const unsigned char* end) noexcept {
  if (*p < 0x80) return {kAsciiClass.cls[*p], 1};
  char32_t cp;
  const size_t len = utf8_next(p, end, cp);
  if (cp == kInvalidCodePoint) return {char_class::other, 1};
  return {unicode_class(cp), static_cast<uint32_t>(len)};
}

// End of the run of characters of class `cls` starting at p.
inline const unsigned char* pretok_run(const unsigned char* p, const unsigned char* end, char_class cls) noexcept {
  while (p < end) {
    const pretok_char c = pretok_peek(p, end);
    if (c.cls != cls) break;
    p += c.len;
  }
  return p;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd, lower case only) at p, or 0.
inline size_t pretok_contraction(const unsigned char* p, const unsigned char* end) noexcept {
  if (*p != '\'' || end - p < 2) return 0;
  const unsigned char a = p[1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (end - p < 3) return 0;
  const unsigned char b = p[2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Calls emit(begin, end) (byte offsets into text) for each piece, in order.
template <class Emit>
void pretokenize(std::string_view text, Emit&& emit) {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* p = base;
  const unsigned char* const end = base + text.size();
  while (p < end) {
    const unsigned char* q;
    if (const size_t k = pretok_contraction(p, end)) {
      q = p + k;  // 's|'t|'re|'ve|'m|'ll|'d
    } else {
      const pretok_char c0 = pretok_peek(p, end);
      if (*p == ' ' && p + 1 < end) {
        const pretok_char c1 = pretok_peek(p + 1, end);
        if (c1.cls != char_class::space) {
          // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' with the optional space taken
          q = pretok_run(p + 1 + c1.len, end, c1.cls);
          emit(static_cast<size_t>(p - base), static_cast<size_t>(q - base));
          p = q;
          continue;
        }
      }
      if (c0.cls != char_class::space) {
        q = pretok_run(p + c0.len, end, c0.cls);
      } else {
        // \s+(?!\S) backs off one character when the run is followed by a non-space; \s+ takes a lone one.
        const unsigned char* last = p;
        q = p + c0.len;
        while (q < end) {
          const pretok_char c = pretok_peek(q, end);
          if (c.cls != char_class::space) break;
          last = q;
          q += c.len;
        }
        if (q < end && last != p) q = last;
      }
    }
    emit(static_cast<size_t>(p - base), static_cast<size_t>(q - base));
    p = q;
  }
}

}  // namespace detail
OPT_NAMESPACE_END
