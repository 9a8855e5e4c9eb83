// Bytes and code points: GPT-2's reversible byte <-> unicode alphabet (`bytes_to_unicode` in HF's
// tokenization_gpt2.py / tokenizers' byte_level.rs), strict UTF-8 stepping for the pre-tokenizer, and UTF-8
// repair exactly like Python's bytes.decode("utf-8", errors="replace") for the decoder.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

// GPT-2 gives each byte a printable code point: the bytes '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF map to
// themselves; the other 68 bytes get U+0100, U+0101, ... in byte order. Every code point is below 324.
struct byte_unicode_table {
  char32_t byte_to_cp[256] = {};
  int16_t cp_to_byte[324] = {};  // -1 where the code point is no byte's image

  constexpr byte_unicode_table() {
    for (auto& b : cp_to_byte) b = -1;
    unsigned next = 256;
    for (unsigned b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = self ? b : next++;
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};
inline constexpr byte_unicode_table kByteUnicode{};

// Appends the UTF-8 encoding of a code point (no validation: callers pass scalar values).
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Byte-level alphabet string of raw bytes: each byte becomes its GPT-2 code point, in UTF-8.
inline std::string bytes_to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) append_utf8(out, kByteUnicode.byte_to_cp[c]);
  return out;
}

inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFFu;

// Valid second-byte range of a UTF-8 lead byte (the Unicode "well-formed byte sequences" table, which Python's
// decoder follows). Returns the sequence length, or 0 for a byte that cannot start a sequence.
inline int utf8_lead(unsigned char b, unsigned char& lo, unsigned char& hi) noexcept {
  lo = 0x80;
  hi = 0xBF;
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) {
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
    return 3;
  }
  if (b < 0xF5) {
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

// Decodes one code point at p (p < end). Returns the number of bytes used (>= 1). A byte that does not start a
// complete, well-formed sequence yields kInvalidCodePoint and length 1: the pre-tokenizer treats each such byte
// as a character of its own that is neither letter, number nor space.
inline size_t utf8_next(const unsigned char* p, const unsigned char* end, char32_t& cp) noexcept {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  unsigned char lo, hi;
  const int n = utf8_lead(b0, lo, hi);
  if (n == 0 || end - p < n || p[1] < lo || p[1] > hi) {
    cp = kInvalidCodePoint;
    return 1;
  }
  char32_t v = b0 & (0x7F >> n);
  v = (v << 6) | (p[1] & 0x3F);
  for (int k = 2; k < n; ++k) {
    if ((p[k] & 0xC0) != 0x80) {
      cp = kInvalidCodePoint;
      return 1;
    }
    v = (v << 6) | (p[k] & 0x3F);
  }
  cp = v;
  return static_cast<size_t>(n);
}

// Appends `in` to `out` as valid UTF-8, replacing ill-formed parts with U+FFFD exactly as CPython's
// bytes.decode("utf-8", errors="replace") does: one U+FFFD per maximal subpart of an ill-formed sequence (a lone
// or invalid byte, or a well-formed prefix cut short). With final = false a well-formed but incomplete sequence
// at the very end is left unconsumed (it may still be completed by later bytes). Returns the bytes consumed.
inline size_t utf8_repair_append(std::string_view in, bool final, std::string& out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    // ASCII run
    size_t j = i;
    while (j < n && s[j] < 0x80) ++j;
    out.append(in.data() + i, j - i);
    i = j;
    if (i >= n) break;
    unsigned char lo, hi;
    const int len = utf8_lead(s[i], lo, hi);
    if (len == 0) {
      out.append(kReplacement, 3);
      ++i;
      continue;
    }
    // count the well-formed prefix
    size_t k = 1;
    while (k < static_cast<size_t>(len) && i + k < n) {
      const unsigned char c = s[i + k];
      const bool ok = (k == 1) ? (c >= lo && c <= hi) : ((c & 0xC0) == 0x80);
      if (!ok) break;
      ++k;
    }
    if (k == static_cast<size_t>(len)) {
      out.append(in.data() + i, k);
      i += k;
    } else if (i + k == n && !final) {
      return i;  // incomplete sequence at the end: wait for more bytes
    } else {
      out.append(kReplacement, 3);
      i += k;
    }
  }
  return n;
}

}  // namespace detail
OPT_NAMESPACE_END
