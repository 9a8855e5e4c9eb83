// The --max-shard-size option of opt-convert and opt-make-random: "0", "1234", "500MB", "2GB", "1.5GiB" -> bytes
// (decimal units as transformers' max_shard_size, binary with "i"; case-insensitive).
#pragma once
#include <cctype>
#include <cstdint>
#include <opt/error.hpp>
#include <string>

inline uint64_t parse_size(const std::string& s) {
  size_t i = 0, digits = 0, dots = 0;
  for (; i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'); ++i)
    (s[i] == '.' ? dots : digits)++;
  if (digits == 0 || dots > 1) throw opt::input_error("--max-shard-size: '" + s + "' is not a size like 2GB");
  double v = std::stod(s.substr(0, i));
  std::string unit = s.substr(i);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double mul;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else if (unit == "KIB") mul = 1024.0;
  else if (unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "GIB") mul = 1024.0 * 1024 * 1024;
  else throw opt::input_error("--max-shard-size: unknown unit '" + s.substr(i) + "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  return uint64_t(v * mul);
}
