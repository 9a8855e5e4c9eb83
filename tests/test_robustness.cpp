// Robustness: a catalogue of hostile model folders built by the test itself, the limits that protect a host, and
// every input the fuzzers (tests/fuzz) found to crash the library, kept as byte strings. Each hostile folder must
// give a specific opt::error subclass whose message names what is wrong; none may crash, hang, or allocate much
// beyond the size of the folder's files (measured with a counting operator new, in the sanitizer build too).
//
// This translation unit lowers the two parser caps so that they can be tested with small files. That is safe: it
// is its own program, and the caps are read only where a file is parsed.
#define OPT_MAX_HEADER_BYTES (1u << 20)
#define OPT_MAX_TENSORS 200u
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <opt/generate.hpp>
#include <opt/pytorch.hpp>
#include <opt/tokenizer.hpp>

#include "shared.hpp"

// ---- a counting allocator: peak heap bytes during one load ---------------------------------------------------
// Replacing the global operator new/delete is allowed under ASan: these go through malloc/free, which ASan
// intercepts (so it still sees every block), and malloc_usable_size is the size asked for there.
#include <malloc.h>
namespace {
std::atomic<int64_t> g_heap_now{0}, g_heap_peak{0};
void* counted_alloc(size_t n, size_t align) {
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) p = std::malloc(n ? n : 1);
  else if (::posix_memalign(&p, align, n ? n : 1) != 0) p = nullptr;
  if (!p) throw std::bad_alloc();
  const int64_t now = g_heap_now += int64_t(::malloc_usable_size(p));
  int64_t peak = g_heap_peak.load();
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}
void counted_free(void* p) noexcept {
  if (!p) return;
  g_heap_now -= int64_t(::malloc_usable_size(p));
  std::free(p);
}
}  // namespace
void* operator new(size_t n) { return counted_alloc(n, 0); }
void* operator new[](size_t n) { return counted_alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
// the nothrow forms too (simdjson's parser uses them): left to the runtime, ASan's would pair with our delete
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try { return counted_alloc(n, 0); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try { return counted_alloc(n, size_t(a)); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept { return operator new(n, a, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path scratch(const std::string& name) { return opt_test::scratch("robustness/" + name); }
using opt_test::u64le;
void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}
uint64_t folder_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

// opt-tiny-preln as parts: config.json, and model.safetensors split into its u64 length, header JSON and data.
struct Base {
  json config;
  std::string file, header;
  uint64_t data_start = 0;
  std::vector<std::pair<std::string, uint64_t>> ends;  // tensor name -> end offset, in offset order
};
const Base& base() {
  static const Base b = [] {
    Base b;
    const fs::path dir = opt_test::fixture_dir("opt-tiny-preln");
    b.config = opt_test::read_json(dir / "config.json");
    b.file = opt_test::read_text(dir / "model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(b.file[size_t(i)]);
    b.header = b.file.substr(8, size_t(n));
    b.data_start = 8 + n;
    const json h = json::parse(b.header);
    for (auto& [k, v] : h.items())
      if (k != "__metadata__") b.ends.push_back({k, v["data_offsets"][1].get<uint64_t>()});
    std::sort(b.ends.begin(), b.ends.end(), [](auto& x, auto& y) { return x.second < y.second; });
    return b;
  }();
  return b;
}
// A safetensors file with the base's data and an edited header.
std::string with_header(const json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  return u64le(h.size()) + h + data;
}
std::string base_data() { return base().file.substr(size_t(base().data_start)); }
json base_header() { return json::parse(base().header); }

// One hostile folder: how to build it, what Model::load must throw, and words its message must hold.
enum class kind { io, format, config, tensor, limit };
struct Case {
  std::string name;
  std::function<void(const fs::path&)> build;  // writes into an empty folder
  kind expect;
  std::vector<std::string> words;
};
const char* kind_name(kind k) {
  switch (k) {
    case kind::io: return "io_error";
    case kind::format: return "format_error";
    case kind::config: return "config_error";
    case kind::tensor: return "tensor_error";
    case kind::limit: return "limit_error";
  }
  return "?";
}
bool is_kind(const opt::error& e, kind k) {
  switch (k) {
    case kind::io: return dynamic_cast<const opt::io_error*>(&e) != nullptr;
    case kind::format: return dynamic_cast<const opt::format_error*>(&e) != nullptr;
    case kind::config: return dynamic_cast<const opt::config_error*>(&e) != nullptr;
    case kind::tensor: return dynamic_cast<const opt::tensor_error*>(&e) != nullptr;
    case kind::limit: return dynamic_cast<const opt::limit_error*>(&e) != nullptr;
  }
  return false;
}

void write_config(const fs::path& dir, const std::function<void(json&)>& edit = nullptr) {
  json c = base().config;
  if (edit) edit(c);
  write(dir / "config.json", c.dump(2));
}
// A folder with the base config and the given model.safetensors bytes.
std::function<void(const fs::path&)> model_file(std::function<std::string()> bytes) {
  return [bytes](const fs::path& d) {
    write_config(d);
    write(d / "model.safetensors", bytes());
  };
}
std::function<void(const fs::path&)> header_edit(std::function<void(json&)> edit) {
  return model_file([edit] {
    json h = base_header();
    edit(h);
    return with_header(h, base_data());
  });
}
std::function<void(const fs::path&)> config_edit(std::function<void(json&)> edit) {
  return [edit](const fs::path& d) {
    write_config(d, edit);
    write(d / "model.safetensors", base().file);
  };
}
// Sets a tensor's entry, keeping its offsets.
void set_tensor(json& h, const std::string& name, const std::string& dtype, const json& shape) {
  h[name]["dtype"] = dtype;
  h[name]["shape"] = shape;
}

const std::string kEmbed = "model.decoder.embed_tokens.weight";
const std::string kQ = "model.decoder.layers.0.self_attn.q_proj.weight";
const std::string kFc1 = "model.decoder.layers.1.fc1.weight";

std::vector<Case> catalogue() {
  std::vector<Case> cs;
  const Base& b = base();
  const uint64_t hlen = b.header.size();
  auto cut = [](uint64_t n) { return model_file([n] { return base().file.substr(0, size_t(n)); }); };
  // ---- headers the JSON parser expands most: ~1 MB of the smallest values, and of nesting ----
  const auto tiny_values = [](const std::string& open, const std::string& unit, const std::string& close) {
    return model_file([=] {
      std::string h = open;
      while (h.size() < (900u << 10)) h += unit;
      h += close;
      while (h.size() % 8) h.push_back(' ');
      return u64le(h.size()) + h;
    });
  };
  cs.push_back({"a 900 KiB header of tiny values", tiny_values("{\"a\":[0", ",0", "]}"), kind::format,
                {"'a' must be described by an object"}});
  cs.push_back({"a 900 KiB header of nesting", tiny_values("{\"a\":", "[", ""), kind::format, {"malformed JSON header"}});
  // ---- truncated at every section boundary ----
  for (uint64_t n : {0, 1, 4, 7})
    cs.push_back({"truncated to " + std::to_string(n) + " bytes (inside the length)", cut(n), kind::format,
                  {"model.safetensors", "too short for the 8-byte header length"}});
  cs.push_back({"truncated after the length", cut(8), kind::format, {"header length", "goes beyond the file"}});
  cs.push_back({"truncated inside the header", cut(8 + hlen / 2), kind::format, {"goes beyond the file"}});
  cs.push_back({"truncated one byte before the header's end", cut(8 + hlen - 1), kind::format,
                {"goes beyond the file"}});
  cs.push_back({"truncated after the header (no data)", cut(8 + hlen), kind::format,
                {"data_offsets", "outside the data section of 0 bytes"}});
  for (auto& [name, end] : b.ends) {
    const uint64_t n = b.data_start + end - 1;  // one byte short of this tensor's end
    cs.push_back({"truncated inside " + name, cut(n), kind::format,
                  {"tensor '", "outside the data section of " + std::to_string(end - 1) + " bytes"}});
  }
  // ---- the header length ----
  auto length = [](uint64_t n) {
    return model_file([n] { return u64le(n) + base().file.substr(8); });
  };
  cs.push_back({"header length 2^63", length(uint64_t(1) << 63), kind::limit,
                {"header length 9223372036854775808", "exceeds the limit of 1048576 bytes"}});
  cs.push_back({"header length 2^64-1", length(~uint64_t(0)), kind::limit, {"exceeds the limit"}});
  cs.push_back({"header length just over OPT_MAX_HEADER_BYTES", length((1u << 20) + 1), kind::limit,
                {"exceeds the limit of 1048576 bytes (OPT_MAX_HEADER_BYTES)"}});
  cs.push_back({"header larger than the file", length(b.file.size()), kind::format,
                {"header length " + std::to_string(b.file.size()), "goes beyond the file"}});
  cs.push_back({"header length 0", model_file([] { return u64le(0) + base_data(); }), kind::format,
                {"cannot hold a JSON object"}});
  cs.push_back({"header not JSON", model_file([] { return u64le(8) + "{\"a\":1,]" + base_data(); }), kind::format,
                {"malformed JSON header"}});
  cs.push_back({"header is an array", model_file([] { return u64le(8) + "[1,2,3] " + base_data(); }), kind::format,
                {"not an object"}});
  // ---- offsets ----
  cs.push_back({"offsets reversed (begin > end)", header_edit([](json& h) {
                  auto o = h[kQ]["data_offsets"];
                  h[kQ]["data_offsets"] = {o[1], o[0]};
                }),
                kind::format, {"tensor '" + kQ + "' data_offsets", "outside the data section"}});
  cs.push_back({"offsets past the end", header_edit([](json& h) {
                  const uint64_t size = base().file.size() - base().data_start;
                  h[kQ]["data_offsets"] = {size - 8, size + 16376};
                }),
                kind::format, {"tensor '" + kQ + "'", "outside the data section"}});
  cs.push_back({"offsets near 2^64", header_edit([](json& h) {
                  h[kQ]["data_offsets"] = {~uint64_t(0) - 8, ~uint64_t(0)};
                }),
                kind::format, {"tensor '" + kQ + "'", "outside the data section"}});
  cs.push_back({"offsets overlapping", header_edit([](json& h) {
                  h["model.decoder.layers.0.self_attn.k_proj.weight"]["data_offsets"] = h[kQ]["data_offsets"];
                }),
                kind::format, {"overlap"}});
  cs.push_back({"offsets negative", header_edit([](json& h) { h[kQ]["data_offsets"] = {-16384, 0}; }), kind::format,
                {"tensor '" + kQ + "' data_offsets must hold non-negative integers"}});
  cs.push_back({"three offsets", header_edit([](json& h) { h[kQ]["data_offsets"].push_back(0); }), kind::format,
                {"must hold 2 numbers, found 3"}});
  cs.push_back({"offsets as floats", header_edit([](json& h) { h[kQ]["data_offsets"] = {0.5, 1.5}; }), kind::format,
                {"non-negative integers"}});
  // ---- dtype / shape ----
  cs.push_back({"dtype/shape disagree with the offsets", header_edit([](json& h) { h[kQ]["dtype"] = "F16"; }),
                kind::format, {"tensor '" + kQ + "' is F16 [64, 64] = 8192 bytes, but data_offsets span 16384"}});
  cs.push_back({"unknown dtype", header_edit([](json& h) { h[kQ]["dtype"] = "F128"; }), kind::format,
                {"unknown dtype 'F128'"}});
  cs.push_back({"integer dtype for a weight", header_edit([](json& h) { h[kQ]["dtype"] = "I32"; }), kind::tensor,
                {"tensor '" + kQ + "' has dtype I32, expected F32, F16 or BF16"}});
  cs.push_back({"shape transposed-like vs config", header_edit([](json& h) { h[kQ]["shape"] = {32, 128}; }),
                kind::tensor, {"tensor '" + kQ + "' has shape [32, 128], expected [64, 64]"}});
  cs.push_back({"zero-sized shape", header_edit([](json& h) {
                  set_tensor(h, kQ, "F32", {0, 64});
                  h[kQ]["data_offsets"] = {0, 0};
                }),
                kind::tensor, {"tensor '" + kQ + "' has shape [0, 64], expected [64, 64]"}});
  cs.push_back({"absurdly large shape (overflows 64 bits)", header_edit([](json& h) {
                  set_tensor(h, kQ, "F32", {int64_t(1) << 40, int64_t(1) << 40});
                }),
                kind::format, {"tensor '" + kQ + "' shape [1099511627776, 1099511627776] overflows"}});
  cs.push_back({"absurdly large shape (fits 64 bits)", header_edit([](json& h) {
                  set_tensor(h, kQ, "F32", {int64_t(1) << 30, int64_t(1) << 30});
                }),
                kind::format, {"= 4611686018427387904 bytes, but data_offsets span 16384"}});
  cs.push_back({"dimension beyond 2^63", header_edit([](json& h) {
                  h[kQ]["shape"] = json::array({uint64_t(1) << 63, 1});
                }),
                kind::format, {"has a dimension beyond 2^63"}});
  cs.push_back({"negative dimension", header_edit([](json& h) { h[kQ]["shape"] = {-64, -64}; }), kind::format,
                {"negative dimension -64"}});
  cs.push_back({"17 dimensions", header_edit([](json& h) { h[kQ]["shape"] = json::array(); for (int i = 0; i < 17; ++i) h[kQ]["shape"].push_back(1); }),
                kind::format, {"more than 16 dimensions"}});
  cs.push_back({"shape not an array", header_edit([](json& h) { h[kQ]["shape"] = "64x64"; }), kind::format,
                {"shape must be an array"}});
  cs.push_back({"missing data_offsets", header_edit([](json& h) { h[kQ].erase("data_offsets"); }), kind::format,
                {"tensor '" + kQ + "' lacks data_offsets"}});
  cs.push_back({"unexpected key in a tensor", header_edit([](json& h) { h[kQ]["crc"] = 1; }), kind::format,
                {"unexpected key 'crc'"}});
  cs.push_back({"__metadata__ value not a string", header_edit([](json& h) { h["__metadata__"] = {{"format", 1}}; }),
                kind::format, {"__metadata__[\"format\"] must be a string"}});
  // ---- names ----
  cs.push_back({"duplicate names in the header", model_file([] {
                  std::string h = base().header;
                  while (!h.empty() && h.back() == ' ') h.pop_back();
                  const std::string entry = "\"" + kQ + "\":" + json::parse(base().header)[kQ].dump();
                  h.insert(1, entry + ",");
                  return u64le(h.size()) + h + base_data();
                }),
                kind::format, {"tensor '" + kQ + "' appears twice"}});
  cs.push_back({"a tensor missing", header_edit([](json& h) { h.erase(kFc1); }), kind::tensor,
                {"missing tensor " + kFc1}});
  cs.push_back({"an unexpected tensor", header_edit([](json& h) { h["model.decoder.layers.2.fc1.weight"] = h[kFc1]; }),
                kind::format, {"overlap"}});  // sharing bytes is caught before the name
  cs.push_back({"an unexpected zero-sized tensor", header_edit([](json& h) {
                  h["model.decoder.layers.7.fc1.weight"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
                }),
                kind::tensor, {"unexpected tensor model.decoder.layers.7.fc1.weight"}});
  cs.push_back({"lm_head.weight of the wrong shape", header_edit([](json& h) {
                  h["lm_head.weight"] = {{"dtype", "F32"}, {"shape", {0, 64}}, {"data_offsets", {0, 0}}};
                }),
                kind::tensor, {"'lm_head.weight' has shape [0, 64], expected [512, 64]"}});
  cs.push_back({"too many tensors (OPT_MAX_TENSORS)", header_edit([](json& h) {
                  for (int i = 0; i < 250; ++i)
                    h["extra." + std::to_string(i)] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
                }),
                kind::limit, {"more than 200 tensors (OPT_MAX_TENSORS)"}});
  // ---- config.json values ----
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "ffn_dim", "num_attention_heads",
                          "max_position_embeddings", "word_embed_proj_dim"}) {
    const std::string k = key;
    cs.push_back({"config " + k + " = 0", config_edit([k](json& c) { c[k] = 0; }), kind::config, {k + " = 0, expected 1.."}});
    cs.push_back({"config " + k + " = -1", config_edit([k](json& c) { c[k] = -1; }), kind::config,
                  {k + " = -1, expected 1.."}});
    cs.push_back({"config " + k + " = 2^62", config_edit([k](json& c) { c[k] = int64_t(1) << 62; }), kind::config,
                  {k + " = 4611686018427387904, expected 1.."}});
    cs.push_back({"config " + k + " = 2^64-1", config_edit([k](json& c) { c[k] = ~uint64_t(0); }), kind::config,
                  {k + " = 18446744073709551615 is out of range"}});
    cs.push_back({"config " + k + " = 1.5", config_edit([k](json& c) { c[k] = 1.5; }), kind::config,
                  {k + " must be an integer, found 1.5"}});
    cs.push_back({"config " + k + " = \"64\"", config_edit([k](json& c) { c[k] = "64"; }), kind::config,
                  {k + " must be an integer"}});
  }
  cs.push_back({"config heads do not divide hidden", config_edit([](json& c) { c["num_attention_heads"] = 3; }),
                kind::config, {"hidden_size 64 is not divisible by num_attention_heads 3"}});
  cs.push_back({"config eos outside the vocabulary", config_edit([](json& c) { c["eos_token_id"] = 512; }),
                kind::config, {"eos_token_id = 512 is outside the vocabulary [0, 512)"}});
  cs.push_back({"config negative pad", config_edit([](json& c) { c["pad_token_id"] = -5; }), kind::config,
                {"pad_token_id = -5"}});
  cs.push_back({"config unknown activation", config_edit([](json& c) { c["activation_function"] = "rm -rf"; }),
                kind::config, {"activation_function: unsupported value \"rm -rf\""}});
  cs.push_back({"config model_type gpt2", config_edit([](json& c) { c["model_type"] = "gpt2"; }), kind::config,
                {"model_type is \"gpt2\", expected \"opt\""}});
  cs.push_back({"config valid but bigger than the weights", config_edit([](json& c) { c["ffn_dim"] = 512; }),
                kind::tensor, {"has shape [256, 64], expected [512, 64] from config.json"}});
  cs.push_back({"config more layers than the weights", config_edit([](json& c) { c["num_hidden_layers"] = 3; }),
                kind::tensor, {"missing tensors model.decoder.layers.2."}});
  cs.push_back({"config not an object", [](const fs::path& d) {
                  write(d / "config.json", "[1]");
                  write(d / "model.safetensors", base().file);
                },
                kind::config, {"expected a JSON object"}});
  cs.push_back({"config empty", [](const fs::path& d) {
                  write(d / "config.json", "");
                  write(d / "model.safetensors", base().file);
                },
                kind::format, {"config.json: malformed JSON"}});
  // ---- files and folders ----
  cs.push_back({"config.json missing", [](const fs::path& d) { write(d / "model.safetensors", base().file); }, kind::io,
                {"config.json: cannot open"}});
  cs.push_back({"model.safetensors missing", [](const fs::path& d) { write_config(d); }, kind::io,
                {"found neither model.safetensors nor model.safetensors.index.json"}});
  cs.push_back({"config.json is a directory", [](const fs::path& d) {
                  fs::create_directories(d / "config.json");
                  write(d / "model.safetensors", base().file);
                },
                kind::io, {"config.json: is a directory"}});
  cs.push_back({"model.safetensors is a directory", [](const fs::path& d) {
                  write_config(d);
                  fs::create_directories(d / "model.safetensors");
                },
                kind::io, {"model.safetensors: is a directory"}});
  cs.push_back({"model.safetensors is a FIFO (would block)", [](const fs::path& d) {
                  write_config(d);
                  REQUIRE(::mkfifo((d / "model.safetensors").c_str(), 0644) == 0);
                },
                kind::io, {"model.safetensors: not a regular file"}});
  cs.push_back({"config.json is a FIFO (would block)", [](const fs::path& d) {
                  REQUIRE(::mkfifo((d / "config.json").c_str(), 0644) == 0);
                  write(d / "model.safetensors", base().file);
                },
                kind::io, {"config.json: not a regular file"}});
  cs.push_back({"model.safetensors is /dev/zero", [](const fs::path& d) {
                  write_config(d);
                  fs::create_symlink("/dev/zero", d / "model.safetensors");
                },
                kind::io, {"not a regular file"}});
  cs.push_back({"model.safetensors is a dangling symlink", [](const fs::path& d) {
                  write_config(d);
                  fs::create_symlink(d / "nowhere.safetensors", d / "model.safetensors");
                },
                kind::io, {"found neither model.safetensors"}});
  // ---- sharded checkpoints ----
  auto sharded = [](std::function<void(json&)> edit_index, std::function<void(const fs::path&)> extra = nullptr) {
    return [edit_index, extra](const fs::path& d) {
      write_config(d);
      const fs::path src = opt_test::fixture_dir("opt-tiny-preln-sharded");
      for (auto& e : fs::directory_iterator(src))
        if (e.path().extension() == ".safetensors") fs::copy_file(e.path(), d / e.path().filename());
      json idx = opt_test::read_json(src / "model.safetensors.index.json");
      edit_index(idx);
      write(d / "model.safetensors.index.json", idx.dump());
      if (extra) extra(d);
    };
  };
  cs.push_back({"index names a missing shard", sharded([](json& i) { i["weight_map"][kQ] = "model-00009-of-00009.safetensors"; }),
                kind::io, {"model-00009-of-00009.safetensors: cannot open"}});
  cs.push_back({"index escapes the folder", sharded([](json& i) { i["weight_map"][kQ] = "../../etc/passwd"; }),
                kind::format, {"\"../../etc/passwd\" is not a plain file name"}});
  cs.push_back({"index puts a tensor in the wrong shard", sharded([](json& i) {
                  auto& m = i["weight_map"];
                  const std::string a = m[kEmbed], other = a.find("00001") != std::string::npos
                                                               ? "model-00002-of-00002.safetensors"
                                                               : "model-00001-of-00002.safetensors";
                  m[kEmbed] = other;
                }),
                kind::tensor, {"weight_map puts '" + kEmbed + "' in"}});
  cs.push_back({"index without weight_map", sharded([](json& i) { i.erase("weight_map"); }), kind::format,
                {"expected an object with a \"weight_map\" object"}});
  cs.push_back({"index weight_map value not a string", sharded([](json& i) { i["weight_map"][kQ] = 7; }),
                kind::format, {"weight_map[\"" + kQ + "\"] must be a file name"}});
  cs.push_back({"index is a directory", [](const fs::path& d) {
                  write_config(d);
                  fs::create_directories(d / "model.safetensors.index.json");
                },
                kind::io, {"model.safetensors.index.json: is a directory"}});
  cs.push_back({"index is not JSON", [](const fs::path& d) {
                  write_config(d);
                  write(d / "model.safetensors.index.json", "{\"weight_map\": {");
                },
                kind::format, {"model.safetensors.index.json: malformed JSON"}});
  cs.push_back({"a tensor in two shards", sharded([](json&) {}, [](const fs::path& d) {
                  // the first shard also holds a copy of a tensor the second one has
                  const fs::path s1 = d / "model-00001-of-00002.safetensors", s2 = d / "model-00002-of-00002.safetensors";
                  opt::SafetensorsFile f1 = opt::SafetensorsFile::open(s1), f2 = opt::SafetensorsFile::open(s2);
                  std::vector<opt::TensorData> t;
                  for (auto& v : f1.tensors()) t.push_back({v.name, v.type, v.shape, v.data});
                  const opt::TensorView& dup = f2.tensors().front();
                  t.push_back({dup.name, dup.type, dup.shape, dup.data});
                  const std::string bytes = opt::safetensors_bytes(t);
                  write(s1, bytes);
                }),
                kind::format, {"is also in"}});
  return cs;
}

// Runs one case: the folder is built, Model::load must throw the expected subclass with the expected words, and
// the heap must not grow beyond README's bound while it tries: 16 times the folder's size plus 128 KiB (simdjson
// expands a JSON header about 15-fold at worst: a header of tiny values; the rest is fixed state and messages).
void run_case(const Case& c, size_t i) {
  const fs::path dir = scratch("case" + std::to_string(i));
  c.build(dir);
  const uint64_t budget = 16 * folder_bytes(dir) + (uint64_t(128) << 10);
  const int64_t before = g_heap_now.load();
  g_heap_peak = before;
  std::string what;
  bool right_kind = false;
  try {
    (void)opt::Model::load(dir);
    what = "(no exception)";
  } catch (const opt::error& e) {
    what = e.what();
    right_kind = is_kind(e, c.expect);
  } catch (const std::exception& e) {
    what = std::string("non-opt exception: ") + e.what();
  }
  const uint64_t grew = uint64_t(std::max<int64_t>(0, g_heap_peak.load() - before));
  CHECK_MESSAGE(grew <= budget, c.name << ": the heap grew by " << grew << " bytes, beyond 16 x " << folder_bytes(dir)
                                        << " + 128 KiB = " << budget);
  CHECK_MESSAGE(right_kind, c.name << ": expected " << kind_name(c.expect) << ", got: " << what);
  for (auto& w : c.words) CHECK_MESSAGE(what.find(w) != std::string::npos, c.name << ": '" << w << "' not in: " << what);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("hostile model folders: each gives a specific opt::error naming what is wrong") {
  const std::vector<Case> cs = catalogue();
  MESSAGE("hostile model folder catalogue: " << cs.size() << " cases");
  CHECK(cs.size() >= 100);
  for (size_t i = 0; i < cs.size(); ++i) {
    CAPTURE(cs[i].name);
    run_case(cs[i], i);
  }
}

TEST_CASE("unreadable files: an io_error naming the file (checked as an unprivileged user when run as root)") {
  // As root (who reads any file: chmod 000 blocks nothing) the check runs in a child dropped to nobody, on a
  // folder of its own under the system temp folder (0755, every folder above it searchable by others).
  const bool root = ::geteuid() == 0;
  fs::path dir;
  if (root) {
    std::string tmpl = (fs::temp_directory_path() / "opt_unreadable_XXXXXX").string();
    REQUIRE_MESSAGE(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp " << tmpl << ": " << std::strerror(errno));
    dir = tmpl;
    fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
    for (fs::path p = dir; p != p.root_path(); p = p.parent_path())
      REQUIRE_MESSAGE((fs::status(p).permissions() & fs::perms::others_exec) != fs::perms::none,
                      "running as root and " << p.string() << " is not searchable by others: nobody cannot reach "
                                             << dir.string());
  } else {
    dir = scratch("unreadable");
  }
  write_config(dir);
  write(dir / "model.safetensors", base().file);
  fs::permissions(dir / "model.safetensors", fs::perms::none);
  fs::permissions(dir / "config.json", fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  auto attempt = [&]() -> std::string {
    try {
      (void)opt::Model::load(dir);
      return "loaded";
    } catch (const opt::io_error& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("other: ") + e.what();
    }
  };
  const std::string want = "model.safetensors: cannot open: Permission denied";
  if (!root) {
    const std::string what = attempt();
    CHECK_MESSAGE(what.find(want) != std::string::npos, what);
    fs::permissions(dir / "model.safetensors", fs::perms::owner_all);
    return;
  }
  int out[2];  // the child's outcome (attempt()'s string), for the failure message
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(out[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    if (::geteuid() != 65534) ::_exit(4);
    const std::string what = attempt();
    if (::write(out[1], what.data(), what.size()) != ssize_t(what.size())) ::_exit(5);
    ::_exit(what.find(want) != std::string::npos ? 0 : what == "loaded" ? 2 : 1);
  }
  ::close(out[1]);
  std::string what;
  char buf[512];
  for (ssize_t k; (k = ::read(out[0], buf, sizeof buf)) > 0;) what.append(buf, size_t(k));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  fs::permissions(dir / "model.safetensors", fs::perms::owner_all);
  fs::remove_all(dir);
  REQUIRE(WIFEXITED(status));
  CHECK_MESSAGE(WEXITSTATUS(status) != 3, "running as root: could not drop to uid/gid 65534 in the child");
  CHECK_MESSAGE(WEXITSTATUS(status) != 4, "running as root: after setuid the child's euid is not 65534");
  CHECK_MESSAGE(WEXITSTATUS(status) == 0, "as uid 65534, a chmod 000 model.safetensors did not give the io_error (child exit "
                                              << WEXITSTATUS(status) << ": 2 = it loaded): got '" << what << "', want '"
                                              << want << "'");
}

TEST_CASE("NaN and Inf weights pass through: loading succeeds and the logits hold NaN/Inf (documented)") {
  // A model file is data: the loader checks structure, not values (checking every weight would read the whole
  // file at load). A NaN in a used weight reaches the logits; greedy decoding still returns an id in range.
  const fs::path dir = scratch("nan");
  opt::SafetensorsFile src = opt::SafetensorsFile::open(opt_test::fixture_dir("opt-tiny-preln") / "model.safetensors");
  std::vector<std::vector<float>> copies;
  std::vector<opt::TensorData> t;
  for (auto& v : src.tensors()) {
    copies.emplace_back(v.nbytes / 4);
    std::memcpy(copies.back().data(), v.data, v.nbytes);
    if (v.name == kEmbed) {
      copies.back()[5 * 64 + 3] = std::numeric_limits<float>::quiet_NaN();  // row of token 5
      copies.back()[7 * 64 + 1] = std::numeric_limits<float>::infinity();   // row of token 7
    }
    t.push_back({v.name, v.type, v.shape, copies.back().data()});
  }
  opt::save_safetensors(dir / "model.safetensors", t);
  write_config(dir);
  opt::Model m = opt::Model::load(dir);
  opt::KvCache kv(m.config(), 8);
  opt::Workspace ws(1);
  const int32_t ids[] = {2, 5};
  opt::LogitsView l = m.forward({{&kv, ids, 2}}, ws);
  bool any_nan = false;
  for (int64_t j = 0; j < l.cols; ++j) any_nan |= std::isnan(l.row(0)[j]);
  CHECK(any_nan);
  opt::GenerateOptions o;
  o.max_new_tokens = 3;
  auto out = opt::generate_ids(m, {{2, 5}, {2, 7}, {2, 9}}, o);
  for (auto& row : out.sequences)
    for (int32_t id : row) CHECK((id >= 0 && id < 512));
}

TEST_CASE("limits: header size and tensor count caps are limit_errors; prompts longer than the context are input_errors") {
  // The header cap is checked before anything is allocated for the header.
  CHECK_THROWS_AS(opt::SafetensorsFile::from_bytes(u64le((1u << 20) + 1) + std::string(64, ' ')), opt::limit_error);
  CHECK_NOTHROW(opt::SafetensorsFile::from_bytes(u64le(2) + "{}"));
  // Prompts longer than the context: never truncated silently; an input_error naming the lengths.
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const int64_t ctx = m.config().max_position_embeddings;  // 64
  std::vector<int32_t> prompt(size_t(ctx + 1), 4);
  opt::GenerateOptions o;
  o.max_new_tokens = 0;
  try {
    opt::generate_ids(m, {prompt}, o);
    FAIL("no exception for a prompt longer than the context");
  } catch (const opt::input_error& e) {
    CHECK(std::string(e.what()).find("beyond max_position_embeddings") != std::string::npos);
  }
  // A prompt that fits but prompt + max_new_tokens does not: also refused before anything is allocated.
  std::vector<int32_t> fits(size_t(ctx - 2), 4);
  o.max_new_tokens = 3;
  CHECK_THROWS_AS(opt::generate_ids(m, {fits}, o), opt::input_error);
  // max_new_tokens near INT64_MAX: an input_error, with no overflow of prompt + max_new_tokens on the way (the
  // sanitizer build runs this)
  for (int64_t n : {INT64_MAX, INT64_MAX - 1, int64_t(1) << 62}) {
    o.max_new_tokens = n;
    CHECK_THROWS_AS(opt::generate_ids(m, {fits}, o), opt::input_error);
    opt::Batch b(m, 1);
    opt::SequenceOptions so;
    so.max_new_tokens = n;
    CHECK_THROWS_AS(b.add(fits, so), opt::input_error);
  }
  // The KvCache for a sequence is sized by the model's context, never by a caller's max_new_tokens.
  CHECK_THROWS_AS((void)opt::KvCache(m.config(), ctx + 1), opt::input_error);
}

// ---- regressions: inputs the fuzzers found (tests/fuzz), kept as byte strings ---------------------------------

TEST_CASE("fuzz regression: tokenizer JSON that simdjson cannot start (empty, invalid UTF-8) is a format_error") {
  // fuzz_tokenizer_json / fuzz_tokenizer_blobs, first input: the error message asked the never-started On-Demand
  // document for its location, a null-pointer read (UBSan: simdjson.h token_iterator::peek_index; a SIGSEGV in
  // release builds).
  for (const std::string& blob : {std::string(), std::string("\xff"), std::string("   "), std::string("\"\xc3")}) {
    CHECK_THROWS_AS(opt::Tokenizer::from_tokenizer_json(blob), opt::format_error);
    CHECK_THROWS_AS(opt::Tokenizer::from_blobs(blob, "#version: 0.2\n"), opt::format_error);
  }
}

TEST_CASE("fuzz regression: tokenizer files with JSON values of unexpected types are opt::errors") {
  // fuzz_tokenizer_json: a pre_tokenizer whose "type" was a number threw nlohmann's type_error out of the library
  // (tests/fuzz/regressions/tokenizer_json/ holds the original input).
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "</s>": 1}, "merges": []})";
  for (const char* pre : {R"({"type": 5})", R"({"type": null})", R"([1])", R"("ByteLevel")",
                                 R"({"type": "Sequence", "pretokenizers": {"a": {"type": "ByteLevel"}}})",
                                 R"({"type": "Sequence", "pretokenizers": [{"type": ["ByteLevel"]}]})"}) {
    INFO(pre);
    const std::string blob = "{" + model + R"(, "pre_tokenizer": )" + pre + "}";
    CHECK_THROWS_AS(opt::Tokenizer::from_tokenizer_json(blob), opt::tokenizer_error);
  }
  // fuzz_tokenizer_json, second finding: an added token's id 1.3e22 was cast to int32 (undefined behaviour, UBSan),
  // and an id of 2^32 + 2 wrapped silently to 2
  const std::string bl = R"(, "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"content": "<x>", "id": )";
  for (const char* id : {"1.3e22", "4294967298", "-1", "18446744073709551615", "2.0", "\"3\"", "16777216"}) {
    INFO(id);
    CHECK_THROWS_WITH_AS(opt::Tokenizer::from_tokenizer_json("{" + model + bl + id + "}]}"),
                         doctest::Contains("expected an integer in [0, 16777215]"), opt::format_error);
  }
  CHECK(opt::Tokenizer::from_tokenizer_json("{" + model + bl + "5}]}").token_to_id("<x>") == 5);
  // the original inputs, replayed as the fuzz target runs them: load, or fail with an opt::error
  const fs::path saved = fs::path(OPT_SOURCE_DIR) / "tests" / "fuzz" / "regressions" / "tokenizer_json";
  REQUIRE(fs::is_directory(saved));
  for (const auto& f : fs::directory_iterator(saved)) {
    INFO(f.path().string());
    try {
      (void)opt::Tokenizer::from_tokenizer_json(opt_test::read_text(f.path())).encode("Hello world");
    } catch (const opt::error&) {
    } catch (const std::exception& e) {
      FAIL("an exception that is not an opt::error: " << e.what());
    }
  }
  const std::string ok = "{" + model + R"(, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": )";
  CHECK_THROWS_AS(opt::Tokenizer::from_tokenizer_json(ok + R"({"type": 1.5}})"), opt::tokenizer_error);
  CHECK(opt::Tokenizer::from_tokenizer_json(ok + "null}").encode("a") == std::vector<int32_t>{1, 0});

  // fuzz_tokenizer_config: the same in tokenizer_config.json / special_tokens_map.json
  const std::string vocab = R"({"a": 0, "</s>": 1, "<pad>": 2})", merges = "#version: 0.2\n";
  auto with_config = [&](const std::string& cfg) { return opt::Tokenizer::from_blobs(vocab, merges, cfg); };
  // an id key beyond int32 wrapped silently (4294967298 became id 2): now a format_error
  CHECK_THROWS_AS(with_config(R"({"added_tokens_decoder": {"4294967298": {"content": "x"}}})"), opt::format_error);
  CHECK_THROWS_AS(with_config(R"({"added_tokens_decoder": {"-1": {"content": "x"}}})"), opt::format_error);
  CHECK_THROWS_AS(with_config(R"({"added_tokens_decoder": {"2": {"content": "<pad>", "special": "yes"}}})"),
                  opt::format_error);
  CHECK_THROWS_AS(with_config(R"({"added_tokens_decoder": {"2": "<pad>"}})"), opt::format_error);
  CHECK_THROWS_AS(with_config(R"({"bos_token": {"content": 5}})"), opt::format_error);
  CHECK_THROWS_AS(with_config(R"([1, 2])"), opt::format_error);
  // entries of additional_special_tokens that are not strings are skipped, as before for non-objects
  CHECK(with_config(R"({"additional_special_tokens": [{"content": 5}, 7, "</s>"]})").encode("a") ==
        std::vector<int32_t>{1, 0});
  CHECK(opt::Tokenizer::from_blobs(vocab, merges, "", R"({"pad_token": "<pad>"})").pad_token_id() == 2);
}

TEST_CASE("regression: overlapping tensors around an empty one are found") {
  // Only neighbours were compared after sorting by begin: A=[0,16) and C=[8,12) with an empty B=[4,4) between
  // them passed.
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  try {
    opt::SafetensorsFile::from_bytes(u64le(h.size()) + h + std::string(16, '\0'), "e.safetensors");
    FAIL("no exception");
  } catch (const opt::format_error& e) {
    CHECK(std::string(e.what()).find("tensors 'a' and 'c' overlap") != std::string::npos);
  }
  // Empty tensors anywhere, and tensors listed out of offset order, are fine.
  const std::string ok =
      R"({"c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  CHECK(opt::SafetensorsFile::from_bytes(u64le(ok.size()) + ok + std::string(16, '\0')).tensors().size() == 3);
}

TEST_CASE("shard index parsing from memory (detail::parse_weight_map, the fuzzed half of Checkpoint::open)") {
  auto m = opt::detail::parse_weight_map(R"({"weight_map":{"a":"s1","b":"s2","c":"s1"}})", "idx");
  CHECK(m.size() == 2);
  CHECK(m["s1"] == std::vector<std::string>{"a", "c"});
  CHECK_THROWS_AS(opt::detail::parse_weight_map("", "idx"), opt::format_error);
  CHECK_THROWS_AS(opt::detail::parse_weight_map(R"({"weight_map":{"a":".."}})", "idx"), opt::format_error);
  CHECK_THROWS_AS(opt::detail::parse_weight_map(R"({"weight_map":{"a":"x\\y"}})", "idx"), opt::format_error);
}
