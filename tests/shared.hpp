// Test helpers: where ../shared is, and reading its fixtures. A missing shared/ fails the test, never skips it.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace opt_test {

// f() throws an E whose message contains every one of `parts` (a wrong type or no exception fails the test).
template <class E>
void check_throws(const std::function<void()>& f, const std::vector<std::string>& parts) {
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    std::string what = e.what();
    for (auto& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, "'" << p << "' not in: " << what);
  } catch (const std::exception& e) {
    FAIL("wrong exception type: " << e.what());
  }
  CHECK_MESSAGE(thrown, "no exception");
}

inline std::filesystem::path shared_dir() {
  std::filesystem::path p = OPT_SHARED_DIR;
  REQUIRE_MESSAGE(std::filesystem::exists(p / "fixtures" / "manifest.json"),
                  "shared/ not found at " << p.string() << " (set -DOPT_SHARED_DIR=...)");
  return p;
}
inline std::filesystem::path fixture_dir(const std::string& model) { return shared_dir() / "fixtures" / model; }

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p.string());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
inline nlohmann::json read_json(const std::filesystem::path& p) { return nlohmann::json::parse(read_text(p)); }

// A raw little-endian float32 array described by a goldens.json descriptor {file, shape, ...}.
inline std::vector<float> read_f32(const std::filesystem::path& dir, const nlohmann::json& desc) {
  std::string bytes = read_text(dir / desc.at("file").get<std::string>());
  size_t n = 1;
  for (auto& d : desc.at("shape")) n *= d.get<size_t>();
  REQUIRE(bytes.size() == n * 4);
  std::vector<float> v(n);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// A scratch folder under the build tree, emptied for each test.
inline std::filesystem::path scratch(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(OPT_BINARY_DIR) / "test-scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// A u64 as 8 little-endian bytes (the safetensors header length).
inline std::string u64le(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char((n >> (8 * i)) & 0xff));
  return s;
}

inline std::vector<std::string> fixture_models() {
  std::vector<std::string> names;
  const nlohmann::json manifest = read_json(shared_dir() / "fixtures" / "manifest.json");
  for (auto& m : manifest.at("models")) names.push_back(m.at("dir"));
  return names;
}

}  // namespace opt_test
