// The stored packed format (include/opt/packed.hpp): a stored int8 folder runs to the bits of quantizing at load,
// a stored float-panel folder to the bits of the normal load, single file and sharded, converted from safetensors
// or pytorch_model.bin or written random; the model then owns no copy of the weights (they run from the mapping);
// and bad folders (metadata, sizes, alignment, scheme against LoadOptions) are opt::errors saying what is wrong.
#include <fstream>
#include <opt/generate.hpp>
#include <opt/packed.hpp>
#include <opt/random_checkpoint.hpp>

#include "shared.hpp"
#include "stored_weights.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using opt_test::scratch;

using opt_test::check_throws;

// All-position logits of every golden prompt of `fixture` (or of a few fixed prompts when it is empty), row after
// row: what two loads must agree on bit for bit.
std::vector<float> logits(const opt::Model& m, const std::string& fixture = "") {
  std::vector<std::vector<int32_t>> prompts;
  if (fixture.empty()) {
    prompts = {{2, 17, 250, 3, 99}, {2, 7}};
  } else {
    const json goldens = opt_test::read_json(opt_test::fixture_dir(fixture) / "goldens.json");
    for (const auto& cs : goldens.at("cases"))
      for (auto& r : opt::unpad(cs.at("input_ids").get<std::vector<std::vector<int32_t>>>(),
                                cs.at("attention_mask").get<std::vector<std::vector<int32_t>>>()))
        prompts.push_back(r);
  }
  std::vector<float> out;
  opt::Workspace ws(2);
  for (const auto& p : prompts) {
    opt::KvCache kv(m.config());
    opt::ForwardOptions fo;
    fo.all_logits = true;
    const opt::LogitsView l = m.forward({{&kv, p.data(), int64_t(p.size())}}, ws, fo);
    out.insert(out.end(), l.data, l.data + l.rows * l.cols);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

size_t count_files(const fs::path& dir, const std::string& ext) {
  size_t n = 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ext;
  return n;
}

// Every .panels / .scales of the loaded model lies in the mapping (the checks of packed_view did it) and is 64-byte
// aligned; the model owns no weight bytes.
void check_runs_from_mapping(const opt::Model& m) {
  CHECK(m.stored_scheme().has_value());
  CHECK(m.owned_weight_bytes() == 0);
  const opt::ModelWeights& w = m.weights();
  CHECK(reinterpret_cast<uintptr_t>(w.lm_head().data) % 64 == 0);
  for (const auto& L : w.layers)
    for (const opt::LinearWeights* l : {&L.q_proj, &L.k_proj, &L.v_proj, &L.out_proj, &L.fc1, &L.fc2}) {
      CHECK(l->weight.data == nullptr);
      CHECK(reinterpret_cast<uintptr_t>(l->packed.data) % 64 == 0);
    }
}

// A copy of the single-file packed folder `src` whose tensors and metadata `edit` changed.
fs::path edited(const fs::path& src, const std::string& name,
                const std::function<void(std::vector<opt::TensorData>&, std::map<std::string, std::string>&)>& edit,
                size_t align = 64) {
  const opt::SafetensorsFile f = opt::SafetensorsFile::open(src / "model.safetensors");
  std::vector<opt::TensorData> t;
  for (auto& v : f.tensors()) t.push_back({v.name, v.type, v.shape, v.data});
  std::map<std::string, std::string> md = f.metadata();
  edit(t, md);
  const fs::path dir = scratch(name);
  opt::save_safetensors(dir / "model.safetensors", t, md, align);
  fs::copy_file(src / "config.json", dir / "config.json");
  return dir;
}

opt::TensorData* find(std::vector<opt::TensorData>& t, const std::string& name) {
  for (auto& x : t)
    if (x.name == name) return &x;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace

TEST_CASE("stored int8 / int4 (opt-convert --quantize) runs to the bits of quantizing at load, on every fixture") {
  for (const std::string& name : opt_test::fixture_models()) {
    INFO(name);
    const fs::path src = opt_test::fixture_dir(name);
    for (const opt::dtype qt : {opt::dtype::I8, opt::dtype::I4})
    for (bool lm_head_int8 : {false, true}) {
      INFO(std::string(opt::to_string(qt)) << " lm_head_int8 " << lm_head_int8);
      opt::LoadOptions lo;
      lo.quantize = qt == opt::dtype::I8 ? opt::quantization::int8 : opt::quantization::int4;
      lo.lm_head_int8 = lm_head_int8;
      const opt::Model at_load = opt::Model::load(src, lo);
      CHECK(at_load.owned_weight_bytes() > 0);
      CHECK_FALSE(at_load.stored_scheme());
      const std::vector<float> want = logits(at_load, name);
      for (uint64_t shard : {uint64_t(0), uint64_t(20000)}) {
        INFO("max_shard_bytes " << shard);
        const fs::path out = scratch("packed-" + name);
        opt::PackedConvertOptions po;
        po.quantize = qt;
        po.lm_head_int8 = lm_head_int8;
        po.max_shard_bytes = shard;
        opt::convert_packed(src, out, po);
        CHECK(fs::exists(out / (shard ? "model.safetensors.index.json" : "model.safetensors")));
        if (shard) CHECK(count_files(out, ".safetensors") > 1);
        const opt::Model stored = opt::Model::load(out);
        check_runs_from_mapping(stored);
        CHECK(stored.stored_scheme()->weight == qt);
        CHECK(stored.stored_scheme()->lm_head == (lm_head_int8 ? qt : at_load.weights().embed_tokens.type));
        CHECK(stored.decode_weight_bytes() == at_load.decode_weight_bytes());
        CHECK(same_bits(logits(stored, name), want));
        // quantize = int8 on a folder that holds what it would make: the same model
        const opt::Model again = opt::Model::load(out, lo);
        CHECK(same_bits(logits(again, name), want));
      }
    }
  }
}

TEST_CASE("stored float panels (opt-convert --packed) run to the bits of the normal load; a cast first too") {
  for (const std::string& name : {std::string("opt-tiny-preln"), std::string("opt-tiny-postln-proj"),
                                  std::string("opt-tiny-preln-bf16"), std::string("opt-tiny-preln-hubstyle")}) {
    INFO(name);
    const fs::path src = opt_test::fixture_dir(name);
    const opt::Model plain = opt::Model::load(src);
    const fs::path out = scratch("packed-float-" + name);
    opt::convert_packed(src, out, {});
    const opt::Model stored = opt::Model::load(out);
    check_runs_from_mapping(stored);
    CHECK(stored.stored_scheme()->weight == plain.weights().layers[0].fc1.weight.type);
    CHECK(same_bits(logits(stored, name), logits(plain, name)));
    // --dtype bf16 --packed against opt-convert --dtype bf16
    opt::PackedConvertOptions po;
    po.cast = opt::dtype::BF16;
    opt::convert_packed(src, out, po);
    const fs::path cast = scratch("cast-" + name);
    opt::ConvertOptions co;
    co.cast = opt::dtype::BF16;
    opt::convert_checkpoint(src, cast, co);
    const opt::Model a = opt::Model::load(out), b = opt::Model::load(cast);
    CHECK(a.stored_scheme()->weight == opt::dtype::BF16);
    CHECK(a.stored_scheme()->lm_head == opt::dtype::BF16);
    CHECK(same_bits(logits(a, name), logits(b, name)));
  }
}

TEST_CASE("random stored int8 / int4 / float panels: the bits of the float folder of the same seed, loaded as usual") {
  opt::Config base;
  base.vocab_size = 300, base.hidden_size = 64, base.num_hidden_layers = 3, base.ffn_dim = 128;
  base.num_attention_heads = 4, base.word_embed_proj_dim = 32, base.max_position_embeddings = 32;  // projections
  // sizes that are not multiples of 64 bytes (biases of 72 and LayerNorms of 48, in bf16 the embeddings too): the
  // writer must still put every .panels / .scales on a 64-byte boundary
  opt::Config odd = base;
  odd.vocab_size = 301, odd.hidden_size = 48, odd.num_attention_heads = 3, odd.ffn_dim = 72;
  odd.word_embed_proj_dim = 48;
  for (const opt::Config& c : {base, odd}) {
    for (opt::dtype ft : {opt::dtype::F32, opt::dtype::BF16}) {
      INFO(std::string(opt::to_string(ft)) << " hidden " << c.hidden_size);
      opt::RandomCheckpointOptions o;
      o.seed = 9;
      o.type = ft;
      const fs::path plain = scratch("random-plain");
      opt::write_random_checkpoint(plain, c, o);
      const std::vector<float> want = logits(opt::Model::load(plain));
      for (const opt::dtype qt : {opt::dtype::I8, opt::dtype::I4}) {
      INFO(std::string(opt::to_string(qt)));
      opt::LoadOptions lo;
      lo.quantize = qt == opt::dtype::I8 ? opt::quantization::int8 : opt::quantization::int4;
      const std::vector<float> want_q = logits(opt::Model::load(plain, lo));
      o.type = qt;
      o.float_type = ft;
      for (uint64_t shard : {uint64_t(0), uint64_t(30000)}) {
        o.max_shard_bytes = shard;
        const fs::path q = scratch("random-int8");
        opt::write_random_checkpoint(q, c, o);
        CHECK(fs::exists(q / "model.safetensors.index.json") == (shard > 0));
        CHECK((shard ? count_files(q, ".safetensors") > 2 : count_files(q, ".safetensors") == 1));
        const opt::Model m = opt::Model::load(q);
        check_runs_from_mapping(m);
        CHECK(same_bits(logits(m), want_q));
      }
      }
      o.type = ft;
      o.packed = true;
      o.max_shard_bytes = 0;
      const fs::path p = scratch("random-packed");
      opt::write_random_checkpoint(p, c, o);
      const opt::Model m = opt::Model::load(p);
      check_runs_from_mapping(m);
      CHECK(m.stored_scheme()->weight == ft);
      CHECK(same_bits(logits(m), want));
    }
  }
}

TEST_CASE("a version-1 folder (panels one after the other, no group keys) runs to the bits of version 2") {
  // Version 1 was written before the panels were interleaved in groups (PackedMatrix::group): rewrite a version-2
  // folder's panels as group 1 and mark it version 1; so are folders converted by earlier builds.
  const fs::path v2 = scratch("packed-v2");
  opt::PackedConvertOptions po;
  po.quantize = opt::dtype::I8;
  po.lm_head_int8 = true;
  opt::convert_packed(opt_test::fixture_dir("opt-tiny-preln"), v2, po);
  const opt::Model m2 = opt::Model::load(v2);
  REQUIRE(m2.stored_scheme());
  CHECK(m2.stored_scheme()->weight_group == 4);
  CHECK(m2.stored_scheme()->lm_head_group == 4);
  CHECK(m2.weights().layers[0].fc1.packed.group == 4);
  std::map<std::string, const opt::PackedMatrix*> packed{{"lm_head.weight", &m2.weights().lm_head()}};
  for (size_t i = 0; i < m2.weights().layers.size(); ++i) {
    const auto& L = m2.weights().layers[i];
    const std::string pre = "model.decoder.layers." + std::to_string(i) + ".";
    packed[pre + "self_attn.q_proj.weight"] = &L.q_proj.packed, packed[pre + "self_attn.k_proj.weight"] = &L.k_proj.packed;
    packed[pre + "self_attn.v_proj.weight"] = &L.v_proj.packed, packed[pre + "self_attn.out_proj.weight"] = &L.out_proj.packed;
    packed[pre + "fc1.weight"] = &L.fc1.packed, packed[pre + "fc2.weight"] = &L.fc2.packed;
  }
  std::vector<opt::ops::aligned_vector<std::byte>> bufs(packed.size());
  size_t regrouped = 0;
  const fs::path v1 = edited(v2, "packed-v1", [&](std::vector<opt::TensorData>& t, std::map<std::string, std::string>& md) {
    md["opt.format_version"] = "1";
    md.erase("opt.weight_group");
    md.erase("opt.lm_head_group");
    for (opt::TensorData& d : t) {
      const std::string suffix = ".panels";
      if (d.name.size() < suffix.size() || d.name.compare(d.name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      const opt::PackedMatrix* m = packed.at(d.name.substr(0, d.name.size() - suffix.size()));
      const opt::PackedMatrix r = opt_test::regroup(*m, 1, bufs[regrouped++]);
      CHECK(std::memcmp(r.data, m->data, m->value_bytes()) != 0);  // the layout did change
      d.data = r.data;
    }
  });
  CHECK(regrouped == packed.size());
  const opt::Model m1 = opt::Model::load(v1);
  REQUIRE(m1.stored_scheme());
  CHECK(m1.stored_scheme()->weight_group == 1);
  CHECK(m1.stored_scheme()->lm_head_group == 1);
  CHECK(m1.weights().layers[0].fc1.packed.group == 1);
  check_runs_from_mapping(m1);
  CHECK(same_bits(logits(m1, "opt-tiny-preln"), logits(m2, "opt-tiny-preln")));
}

TEST_CASE("stored packed folders that are wrong are opt::errors naming the file, tensor or key") {
  const fs::path good = scratch("packed-good");
  opt::PackedConvertOptions po;
  po.quantize = opt::dtype::I8;
  opt::convert_packed(opt_test::fixture_dir("opt-tiny-preln"), good, po);
  REQUIRE_NOTHROW(opt::Model::load(good));
  const std::string fc1 = "model.decoder.layers.0.fc1.weight";
  using MD = std::map<std::string, std::string>;
  using TD = std::vector<opt::TensorData>;
  auto load = [](const fs::path& d, opt::LoadOptions lo = {}) { return [d, lo] { opt::Model::load(d, lo); }; };

  // metadata
  check_throws<opt::format_error>(
      load(edited(good, "bad-version", [](TD&, MD& md) { md["opt.format_version"] = "3"; })),
      {"model.safetensors", "opt.format_version", "\"3\"", "expected \"1\" or \"2\""});
  for (const std::string k : {"opt.weight_group", "opt.lm_head_group"}) {
    for (const std::string g : {"0", "65", "x", "", "-4", "0004000"})
      check_throws<opt::format_error>(
          load(edited(good, "bad-group", [&](TD&, MD& md) { md[k] = g; })),
          {"model.safetensors", k, "\"" + g + "\"", "expected an integer from 1 to 64"});
    check_throws<opt::format_error>(load(edited(good, "no-group", [&](TD&, MD& md) { md.erase(k); })),
                                    {"lacks \"" + k + "\""});
  }
  check_throws<opt::format_error>(load(edited(good, "bad-type", [](TD&, MD& md) { md["opt.weight_type"] = "I3"; })),
                                  {"opt.weight_type", "\"I3\"", "F32, F16, BF16, I8, I4"});
  check_throws<opt::format_error>(load(edited(good, "bad-block", [](TD&, MD& md) { md["opt.weight_block"] = "64"; })),
                                  {"opt.weight_block", "\"64\"", "expected \"128\""});
  check_throws<opt::format_error>(load(edited(good, "bad-rows", [](TD&, MD& md) { md["opt.panel_rows"] = "8"; })),
                                  {"opt.panel_rows", "expected \"16\""});
  check_throws<opt::format_error>(load(edited(good, "no-key", [](TD&, MD& md) { md.erase("opt.lm_head_type"); })),
                                  {"lacks \"opt.lm_head_type\""});
  // I8 values declared I4: the block is I8's, not I4's (32)
  check_throws<opt::format_error>(load(edited(good, "int4", [](TD&, MD& md) { md["opt.weight_type"] = "I4"; })),
                                  {"opt.weight_block", "\"128\"", "expected \"32\""});
  // a panel tensor that is short (a truncated write), or of the wrong dtype; scales of the wrong count, or missing
  auto tensor_edit = [&](const std::string& dir, const std::function<void(TD&)>& f) {
    return load(edited(good, dir, [&](TD& t, MD&) { f(t); }));
  };
  check_throws<opt::tensor_error>(tensor_edit("short", [&](TD& t) { find(t, fc1 + ".panels")->shape[0] -= 64; }),
                                  {fc1 + ".panels", "has shape", "expected [", "I8 [", "from config.json"});
  check_throws<opt::tensor_error>(tensor_edit("dtype", [&](TD& t) { find(t, fc1 + ".panels")->type = opt::dtype::I8; }),
                                  {fc1 + ".panels", "has dtype I8, expected U8"});
  check_throws<opt::tensor_error>(tensor_edit("scales", [&](TD& t) { find(t, fc1 + ".scales")->shape[0] -= 16; }),
                                  {fc1 + ".scales", "has shape", "the scales of " + fc1});
  check_throws<opt::tensor_error>(tensor_edit("no-scales",
                                              [&](TD& t) {
                                                t.erase(std::find_if(t.begin(), t.end(), [&](auto& x) {
                                                  return x.name == fc1 + ".scales";
                                                }));
                                              }),
                                  {"missing tensor", fc1 + ".scales"});
  // float panels declared where int8 ones are stored: the sizes disagree
  check_throws<opt::tensor_error>(load(edited(good, "as-f32",
                                              [](TD&, MD& md) {
                                                md["opt.weight_type"] = "F32";
                                                md["opt.weight_block"] = "0";
                                              })),
                                  {".panels", "has shape", "F32 ["});
  // misaligned: an 8-byte tensor before the others (the header block still a multiple of 64)
  static const std::byte pad[8] = {};
  opt::LoadOptions lax;
  lax.strict = false;
  check_throws<opt::tensor_error>(
      load(edited(good, "misaligned", [&](TD& t, MD&) { t.insert(t.begin(), {"pad", opt::dtype::U8, {8}, pad}); }),
           lax),
      {"is not 64-byte aligned", "address mod 64 = 8"});
  // a plain weight beside the panels is unexpected
  static const float w[4] = {};
  check_throws<opt::tensor_error>(
      load(edited(good, "plain-too", [&](TD& t, MD&) { t.push_back({fc1, opt::dtype::F32, {2, 2}, w}); })),
      {"unexpected tensor", fc1});
  // the LoadOptions asks for another scheme than the folder's
  opt::LoadOptions lo;
  lo.quantize = opt::quantization::int8;
  lo.lm_head_int8 = true;
  check_throws<opt::tensor_error>(load(good, lo), {"holds stored packed weights I8 (block 128), LM head F32",
                                                   "LM head quantized", "not quantized again at load"});
  lo.lm_head_int8 = false;
  lo.quantize = opt::quantization::int4;
  check_throws<opt::tensor_error>(load(good, lo), {"holds stored packed weights I8 (block 128)", "quantize = int4"});
  lo.quantize = opt::quantization::int8;
  const fs::path fp = scratch("packed-float");
  opt::convert_packed(opt_test::fixture_dir("opt-tiny-preln"), fp, {});
  lo.lm_head_int8 = false;
  check_throws<opt::tensor_error>(load(fp, lo), {"holds stored packed weights F32, LM head F32", "quantize = int8"});
  // shards that disagree about the scheme
  const fs::path sh = scratch("packed-shards");
  po.max_shard_bytes = 20000;
  opt::convert_packed(opt_test::fixture_dir("opt-tiny-preln"), sh, po);
  {
    const fs::path last = sh / opt::shard_file_name(count_files(sh, ".safetensors"), count_files(sh, ".safetensors"));
    const opt::SafetensorsFile f = opt::SafetensorsFile::open(last);
    TD t;
    for (auto& v : f.tensors()) t.push_back({v.name, v.type, v.shape, v.data});
    std::string bytes = opt::safetensors_bytes(t, {{"format", "pt"}});
    std::ofstream(last, std::ios::binary | std::ios::trunc) << bytes;
  }
  check_throws<opt::format_error>(load(sh), {"declares no packing", "declares packed weights I8"});
}
