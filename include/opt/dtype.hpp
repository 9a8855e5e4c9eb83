// Element types of stored tensors (the safetensors names) and their sizes. Shared by the file readers and the
// kernels, which know nothing of file formats.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

// I4 is not a safetensors type (files store it as U8 bytes): only packed matrices use it, two weights a byte.
enum class dtype { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2, I4 };

inline const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::F64: return "F64";
    case dtype::F32: return "F32";
    case dtype::F16: return "F16";
    case dtype::BF16: return "BF16";
    case dtype::I64: return "I64";
    case dtype::I32: return "I32";
    case dtype::I16: return "I16";
    case dtype::I8: return "I8";
    case dtype::U64: return "U64";
    case dtype::U32: return "U32";
    case dtype::U16: return "U16";
    case dtype::U8: return "U8";
    case dtype::BOOL: return "BOOL";
    case dtype::F8_E4M3: return "F8_E4M3";
    case dtype::F8_E5M2: return "F8_E5M2";
    case dtype::I4: return "I4";
  }
  return "?";
}

constexpr size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::F64: case dtype::I64: case dtype::U64: return 8;
    case dtype::F32: case dtype::I32: case dtype::U32: return 4;
    case dtype::F16: case dtype::BF16: case dtype::I16: case dtype::U16: return 2;
    default: return 1;  // I4: packed matrices count half a byte a weight (ops::panel_column_bytes)
  }
}

inline std::optional<dtype> dtype_from_string(std::string_view s) noexcept {
  static constexpr dtype all[] = {dtype::F64, dtype::F32, dtype::F16, dtype::BF16, dtype::I64,
                                  dtype::I32, dtype::I16, dtype::I8,  dtype::U64,  dtype::U32,
                                  dtype::U16, dtype::U8,  dtype::BOOL, dtype::F8_E4M3, dtype::F8_E5M2};
  for (dtype t : all)
    if (s == to_string(t)) return t;
  return std::nullopt;
}

OPT_NAMESPACE_END
