// Loading: safetensors validation, config.json validation, tensor checks, and bad inputs at the API. Every
// failure is an opt::error subclass whose message names the file / tensor / key and what was expected.
#include <cstdio>
#include <fstream>
#include <opt/generate.hpp>
#include <opt/random_checkpoint.hpp>
#include <set>
#include <sstream>

#include "shared.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using opt_test::scratch;
using opt_test::u64le;

std::string with_header(const std::string& header_json, const std::string& data) {
  return u64le(header_json.size()) + header_json + data;
}

using opt_test::check_throws;

// A model folder whose tensors are opt-tiny-preln's, changed by `edit` (name -> TensorData list).
fs::path tiny_variant(const std::string& name, const std::function<void(std::vector<opt::TensorData>&)>& edit,
                      const std::function<void(json&)>& edit_config = nullptr) {
  static opt::SafetensorsFile src =
      opt::SafetensorsFile::open(opt_test::fixture_dir("opt-tiny-preln") / "model.safetensors");
  std::vector<opt::TensorData> t;
  for (auto& v : src.tensors()) t.push_back({v.name, v.type, v.shape, v.data});
  edit(t);
  fs::path dir = scratch(name);
  opt::save_safetensors(dir / "model.safetensors", t);
  json cfg = opt_test::read_json(opt_test::fixture_dir("opt-tiny-preln") / "config.json");
  if (edit_config) edit_config(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir;
}

}  // namespace

TEST_CASE("safetensors: a well-formed file round-trips through the writer") {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3c00, 0x4000};
  std::string bytes = opt::safetensors_bytes({{"a", opt::dtype::F32, {2, 3}, a.data()}, {"b", opt::dtype::F16, {2}, b.data()}},
                                             {{"format", "pt"}});
  auto f = opt::SafetensorsFile::from_bytes(bytes, "mem.safetensors");
  REQUIRE(f.tensors().size() == 2);
  const opt::TensorView* ta = f.find("a");
  REQUIRE(ta);
  CHECK(ta->shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(ta->data, a.data(), 24) == 0);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.find("b")->type == opt::dtype::F16);
}

TEST_CASE("safetensors: malformed files are format errors that say what is wrong") {
  using E = opt::format_error;
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  auto open = [](std::string bytes) { return [bytes] { opt::SafetensorsFile::from_bytes(bytes, "bad.safetensors"); }; };
  check_throws<E>(open("abc"), {"bad.safetensors", "too short"});
  check_throws<E>(open(u64le(1000) + "{}"), {"bad.safetensors", "header length 1000", "beyond the file"});
  check_throws<opt::limit_error>(open(u64le(uint64_t(1) << 63) + "{}"), {"header length", "exceeds the limit"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],)", data)), {"malformed JSON"});
  check_throws<E>(open(with_header(R"([1,2])", data)), {"not an object"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F42","shape":[2],"data_offsets":[0,8]}})", data)),
                  {"tensor 'a'", "unknown dtype 'F42'"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data)),
                  {"tensor 'a'", "12 bytes", "span 8 bytes"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data)),
                  {"tensor 'a'", "outside the data section of 8 bytes"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data)),
                  {"tensor 'a'", "outside"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data)),
                  {"negative dimension"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   data)),
                  {"'a' and 'b' overlap"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                   data)),
                  {"'a' appears twice"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", data)),
                  {"overflows"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2]}})", data)), {"lacks data_offsets"});
  check_throws<E>(open(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", data)),
                  {"unexpected key 'x'"});
  // a correct one passes
  CHECK_NOTHROW(opt::SafetensorsFile::from_bytes(with_header(ok, data)));
}

TEST_CASE("safetensors: a truncated real file fails at every cut") {
  std::string full = opt_test::read_text(opt_test::fixture_dir("opt-tiny-odd") / "model.safetensors");
  for (size_t cut : {size_t(0), size_t(4), size_t(8), size_t(100), full.size() / 2, full.size() - 1}) {
    CAPTURE(cut);
    CHECK_THROWS_AS(opt::SafetensorsFile::from_bytes(full.substr(0, cut), "cut.safetensors"), opt::format_error);
  }
}

TEST_CASE("files that are missing, or folders where files should be") {
  fs::path dir = scratch("missing");
  check_throws<opt::io_error>([&] { opt::Model::load(dir); }, {"config.json", "cannot open"});
  fs::copy_file(opt_test::fixture_dir("opt-tiny-preln") / "config.json", dir / "config.json");
  check_throws<opt::io_error>([&] { opt::Model::load(dir); }, {"neither model.safetensors nor"});
  fs::create_directory(dir / "model.safetensors");
  check_throws<opt::io_error>([&] { opt::Model::load(dir); }, {"model.safetensors", "is a directory"});
  check_throws<opt::io_error>([&] { opt::Model::load(dir / "nope"); }, {"nope"});
}

TEST_CASE("config.json: bad values are config errors naming the key") {
  using E = opt::config_error;
  auto cfg = [](const std::string& key, json value) {
    json j = opt_test::read_json(opt_test::fixture_dir("opt-tiny-preln") / "config.json");
    j[key] = value;
    return [j] { opt::Config::from_json(j, "config.json"); };
  };
  check_throws<E>(cfg("num_attention_heads", 3), {"hidden_size 64 is not divisible by num_attention_heads 3"});
  check_throws<E>(cfg("activation_function", "swiglu"), {"activation_function", "swiglu"});
  check_throws<E>(cfg("hidden_size", 0), {"hidden_size = 0"});
  check_throws<E>(cfg("num_hidden_layers", -1), {"num_hidden_layers = -1"});
  check_throws<E>(cfg("vocab_size", "big"), {"vocab_size must be an integer"});
  check_throws<E>(cfg("do_layer_norm_before", 1), {"do_layer_norm_before must be true or false"});
  check_throws<E>(cfg("eos_token_id", 100000), {"eos_token_id = 100000", "outside the vocabulary"});
  check_throws<E>(cfg("model_type", "gpt2"), {"model_type", "expected \"opt\""});
  check_throws<E>(cfg("max_position_embeddings", int64_t(1) << 40), {"max_position_embeddings"});
  // defaults for keys an older file lacks
  json j = json::object();
  opt::Config c = opt::Config::from_json(j);
  CHECK(c.hidden_size == 768);
  CHECK(c.word_embed_proj_dim == 768);
  CHECK(c.do_layer_norm_before);
  CHECK(c.has_final_layer_norm());
  j["word_embed_proj_dim"] = nullptr;
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 16;
  CHECK(opt::Config::from_json(j).word_embed_proj_dim == 1024);
  fs::path dir = scratch("badjson");
  std::ofstream(dir / "config.json") << "{\"hidden_size\": ";
  check_throws<opt::format_error>([&] { opt::Config::from_file(dir / "config.json"); }, {"config.json", "malformed JSON"});
}

TEST_CASE("tensors: wrong shape, wrong dtype, missing, unexpected") {
  using E = opt::tensor_error;
  std::vector<float> junk(64 * 65, 0.0f);
  auto dir = tiny_variant("wrong-shape", [&](auto& t) {
    for (auto& x : t)
      if (x.name == "model.decoder.layers.1.fc1.weight") x.shape = {64, 256};  // transposed
  });
  check_throws<E>([&] { opt::Model::load(dir); },
                  {"model.decoder.layers.1.fc1.weight", "shape [64, 256]", "expected [256, 64]"});
  std::vector<int32_t> ints(64, 0);
  dir = tiny_variant("wrong-dtype", [&](auto& t) {
    for (auto& x : t)
      if (x.name == "model.decoder.final_layer_norm.bias") x.type = opt::dtype::I32, x.data = ints.data();
  });
  check_throws<E>([&] { opt::Model::load(dir); }, {"final_layer_norm.bias", "dtype I32", "expected F32, F16 or BF16"});
  dir = tiny_variant("missing", [&](auto& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](auto& x) { return x.name == "model.decoder.layers.0.self_attn.k_proj.bias"; }),
            t.end());
  });
  check_throws<E>([&] { opt::Model::load(dir); }, {"missing tensor", "model.decoder.layers.0.self_attn.k_proj.bias"});
  dir = tiny_variant("unexpected", [&](auto& t) { t.push_back({"model.decoder.layers.7.fc1.weight", opt::dtype::F32, {64, 65}, junk.data()}); });
  check_throws<E>([&] { opt::Model::load(dir); }, {"unexpected tensor", "layers.7.fc1.weight"});
  opt::LoadOptions lo;
  lo.strict = false;
  opt::Model m = opt::Model::load(dir, lo);
  CHECK(m.unexpected_tensors() == std::vector<std::string>{"model.decoder.layers.7.fc1.weight"});
  // a config that disagrees with the file
  dir = tiny_variant("config-mismatch", [](auto&) {}, [](json& j) { j["ffn_dim"] = 128; });
  check_throws<E>([&] { opt::Model::load(dir); }, {"fc1.weight", "expected [128, 64] from config.json"});
  // lm_head.weight is accepted (tied) when its shape fits
  std::vector<float> head(512 * 64, 0.0f);
  dir = tiny_variant("lm-head", [&](auto& t) { t.push_back({"lm_head.weight", opt::dtype::F32, {512, 64}, head.data()}); });
  CHECK_NOTHROW(opt::Model::load(dir));
}

TEST_CASE("sharded checkpoints: a bad index is reported") {
  fs::path dir = scratch("bad-index");
  for (auto& f : fs::directory_iterator(opt_test::fixture_dir("opt-tiny-preln-sharded")))
    if (f.path().extension() == ".json" || f.path().extension() == ".safetensors") fs::copy_file(f.path(), dir / f.path().filename());
  CHECK_NOTHROW(opt::Model::load(dir));
  json idx = opt_test::read_json(dir / "model.safetensors.index.json");
  std::string first = idx["weight_map"].begin().key();
  idx["weight_map"][first] = "../elsewhere.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  check_throws<opt::format_error>([&] { opt::Model::load(dir); }, {"not a plain file name"});
  idx["weight_map"][first] = "model-00002-of-00002.safetensors";
  idx["weight_map"]["model.decoder.layers.0.fc1.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  // whichever of the two moved entries is checked first, the message names the shard that lacks it
  CHECK_THROWS_AS(opt::Model::load(dir), opt::tensor_error);
}

TEST_CASE("bad inputs at the API are input errors") {
  using E = opt::input_error;
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::GenerateOptions go;
  go.max_new_tokens = 4;
  check_throws<E>([&] { opt::generate_ids(m, {}, go); }, {"empty batch"});
  check_throws<E>([&] { opt::generate_ids(m, {{}}, go); }, {"prompt 0 is empty"});
  check_throws<E>([&] { opt::generate_ids(m, {{2, 512}}, go); }, {"512", "outside the vocabulary [0, 512)"});
  check_throws<E>([&] { opt::generate_ids(m, {{2, -1}}, go); }, {"-1", "outside the vocabulary"});
  go.max_new_tokens = 60;
  check_throws<E>([&] { opt::generate_ids(m, {{2, 3, 4, 5, 6}}, go); },
                  {"65 positions", "beyond max_position_embeddings 64"});
  go.max_new_tokens = -1;
  check_throws<E>([&] { opt::generate_ids(m, {{2}}, go); }, {"max_new_tokens = -1"});
  // forward: the cache bounds the positions
  opt::Workspace ws(1);
  opt::KvCache kv(m.config(), 4);
  std::vector<int32_t> ids = {2, 3, 4, 5, 6};
  check_throws<E>([&] { m.forward({{&kv, ids.data(), 5}}, ws); }, {"needs 5 positions", "capacity 4"});
  check_throws<E>([&] { opt::KvCache big(m.config(), 65); }, {"capacity 65 exceeds max_position_embeddings 64"});
  check_throws<E>([&] { m.forward({}, ws); }, {"empty batch"});
  check_throws<E>([&] { opt::unpad({{1, 2}}, {{1}}); }, {"row 0 has 2 ids but 1 mask values"});
  check_throws<E>([&] { opt::unpad({{1, 2}}, {{1, 2}}); }, {"expected 0 or 1"});
  // nothing was appended to the cache by the failed calls
  CHECK(kv.size() == 0);
}

TEST_CASE("limits: absurd max_new_tokens and KV-cache memory are refused before allocation") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::GenerateOptions go;
  go.max_new_tokens = INT64_MAX;  // no signed overflow in the context check
  check_throws<opt::input_error>([&] { opt::generate_ids(m, {{2, 3}}, go); }, {"beyond max_position_embeddings 64"});
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.max_new_tokens = INT64_MAX;
  check_throws<opt::input_error>([&] { batch.add({2, 3}, so); }, {"beyond max_position_embeddings 64"});
  // opt-tiny-preln: 2 layers * 64 hidden * 4 bytes * 2 (k, v) = 1 KiB per position
  CHECK(opt::Batch::cache_bytes_for(m.config(), 10) == 10240);
  go.max_new_tokens = 8;
  go.max_cache_bytes = 3 * 10240 - 1;  // three prompts of 2 tokens + 8 new need 3 * 10 positions
  check_throws<opt::limit_error>([&] { opt::generate_ids(m, {{2, 3}, {2, 4}, {2, 5}}, go); },
                                 {"need 30720 bytes of KV cache", "limit of 30719"});
  go.max_cache_bytes = 3 * 10240;
  CHECK(opt::generate_ids(m, {{2, 3}, {2, 4}, {2, 5}}, go).new_tokens.size() == 3);
  batch.set_max_cache_bytes(2 * 10240);
  so.max_new_tokens = 8;
  batch.add({2, 3}, so);
  batch.add({2, 4}, so);
  check_throws<opt::limit_error>([&] { batch.add({2, 5}, so); }, {"Batch::add", "would exceed 20480 bytes"});
  while (!batch.empty()) batch.step();  // finished sequences free their share
  CHECK_NOTHROW(batch.add({2, 5}, so));
}

TEST_CASE("random checkpoints: every published shape, as the hub's config.json files have it") {
  struct Want {
    const char* name;
    int64_t H, L, heads, F, E;
    bool pre_ln;
  };
  // facebook/opt-*/config.json: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, word_embed_proj_dim,
  // do_layer_norm_before
  const Want want[] = {{"opt-125m", 768, 12, 12, 3072, 768, true},     {"opt-350m", 1024, 24, 16, 4096, 512, false},
                       {"opt-1.3b", 2048, 24, 32, 8192, 2048, true},   {"opt-2.7b", 2560, 32, 32, 10240, 2560, true},
                       {"opt-6.7b", 4096, 32, 32, 16384, 4096, true},  {"opt-13b", 5120, 40, 40, 20480, 5120, true},
                       {"opt-30b", 7168, 48, 56, 28672, 7168, true},   {"opt-66b", 9216, 64, 72, 36864, 9216, true}};
  REQUIRE(std::size(opt::kOptShapes) == std::size(want));
  for (const Want& w : want) {
    INFO(w.name);
    for (const std::string& n : {std::string(w.name), std::string(w.name).substr(4), "facebook/" + std::string(w.name)}) {
      const opt::Config c = opt::opt_shape(n);
      CHECK(c.hidden_size == w.H);
      CHECK(c.num_hidden_layers == w.L);
      CHECK(c.num_attention_heads == w.heads);
      CHECK(c.ffn_dim == w.F);
      CHECK(c.word_embed_proj_dim == w.E);
      CHECK(c.do_layer_norm_before == w.pre_ln);
      CHECK(c.vocab_size == 50272);
      CHECK(c.max_position_embeddings == 2048);
      CHECK(c.activation_function == "relu");
      CHECK(c.enable_bias);
      CHECK(c.has_final_layer_norm() == w.pre_ln);  // opt-350m has none
      CHECK_NOTHROW(c.validate("opt_shape"));
    }
  }
  // the tensor list: opt-125m has 125,239,296 parameters (the hub's count; lm_head is tied, not a tensor)
  size_t params = 0;
  const auto specs = opt::random_checkpoint_tensors(opt::opt_shape("opt-125m"));
  for (const auto& s : specs) params += s.elements();
  CHECK(params == 125239296u);
  check_throws<opt::input_error>([] { opt::opt_shape("opt-7b"); }, {"unknown model 'opt-7b'", "opt-66b"});
}

TEST_CASE("random checkpoints: shards and an index like the hub's, the same weights as one file") {
  opt::Config c;
  c.vocab_size = 300, c.hidden_size = 64, c.num_hidden_layers = 3, c.ffn_dim = 128, c.num_attention_heads = 4;
  c.word_embed_proj_dim = 64, c.max_position_embeddings = 32;
  const fs::path one = scratch("random-one"), sharded = scratch("random-sharded");
  opt::RandomCheckpointOptions o;
  o.type = opt::dtype::BF16;
  o.seed = 5;
  opt::write_random_checkpoint(one, c, o);
  CHECK(fs::exists(one / "model.safetensors"));
  CHECK_FALSE(fs::exists(one / "model.safetensors.index.json"));
  o.max_shard_bytes = 40000;  // the 38400-byte embedding alone, then layers
  opt::write_random_checkpoint(sharded, c, o);
  CHECK_FALSE(fs::exists(sharded / "model.safetensors"));
  std::ifstream in(sharded / "model.safetensors.index.json");
  std::stringstream text;
  text << in.rdbuf();
  const json index = json::parse(text.str());
  const auto specs = opt::random_checkpoint_tensors(c);
  REQUIRE(index.at("weight_map").size() == specs.size());
  std::set<std::string> files;
  uint64_t total = 0;
  for (const auto& s : specs) {
    files.insert(index.at("weight_map").at(s.name).get<std::string>());
    total += uint64_t(s.elements()) * 2;
  }
  CHECK(index.at("metadata").at("total_size").get<uint64_t>() == total);
  REQUIRE(files.size() > 2);
  for (size_t k = 1; k <= files.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, files.size());
    CHECK(files.count(name) == 1);
    CHECK(fs::exists(sharded / name));
    if (k > 1) {  // each shard but one holding a lone big tensor stays within the limit
      const uint64_t sz = fs::file_size(sharded / name);
      CHECK(sz < 40000 + 4096);
    }
  }
  // both load, to the same logits bit for bit
  const opt::Model a = opt::Model::load(one), b = opt::Model::load(sharded);
  opt::Workspace ws(1);
  const std::vector<int32_t> ids = {2, 17, 250, 3, 99};
  opt::KvCache ka(a.config()), kb(b.config());
  opt::ForwardOptions fo;
  fo.all_logits = true;
  const opt::LogitsView la = a.forward({{&ka, ids.data(), int64_t(ids.size())}}, ws, fo);
  const std::vector<float> first(la.data, la.data + la.rows * la.cols);
  const opt::LogitsView lb = b.forward({{&kb, ids.data(), int64_t(ids.size())}}, ws, fo);
  REQUIRE(size_t(lb.rows * lb.cols) == first.size());
  CHECK(std::equal(first.begin(), first.end(), lb.data));
  // writing the other form over a folder leaves only that form
  o.max_shard_bytes = 0;
  opt::write_random_checkpoint(sharded, c, o);
  CHECK(fs::exists(sharded / "model.safetensors"));
  CHECK_FALSE(fs::exists(sharded / "model.safetensors.index.json"));
  const opt::Model again = opt::Model::load(sharded);
  opt::KvCache kc(again.config());
  const opt::LogitsView lc = again.forward({{&kc, ids.data(), int64_t(ids.size())}}, ws, fo);
  CHECK(std::equal(first.begin(), first.end(), lc.data));
}
