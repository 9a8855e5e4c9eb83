// PyTorch checkpoints: the hub-style fixture's pytorch_model.bin reads bit-identical to its model.safetensors;
// hand-built hostile archives and pickles are rejected with messages naming the problem; convert_checkpoint
// round-trips (single file, cast, shards).
#include <opt/generate.hpp>
#include <opt/pytorch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include <unistd.h>

#include "shared.hpp"

namespace fs = std::filesystem;

namespace {

// ---- builders ---------------------------------------------------------------------------------------------

void put_le(std::string& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(char((v >> (8 * i)) & 0xff));
}

// A pickle, opcode by opcode.
struct Pickle {
  std::string b;
  Pickle& op(uint8_t c) {
    b.push_back(char(c));
    return *this;
  }
  Pickle& proto() { return op(0x80).op(2); }
  Pickle& mark() { return op('('); }
  Pickle& tuple() { return op('t'); }
  Pickle& stop() { return op('.'); }
  Pickle& str(const std::string& s) {
    op('X');
    put_le(b, s.size(), 4);
    b += s;
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) {
    op('c');
    b += module + "\n" + name + "\n";
    return *this;
  }
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      put_le(b, uint64_t(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      put_le(b, uint64_t(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      put_le(b, uint64_t(v), 4);
    } else {
      op(0x8a).op(8);
      put_le(b, uint64_t(v), 8);
    }
    return *this;
  }
  Pickle& ints(const std::vector<int64_t>& v) {
    mark();
    for (int64_t x : v) integer(x);
    return tuple();
  }
  Pickle& ordered_dict() { return global("collections", "OrderedDict").op(')').op('R'); }
  // ('storage', torch.<type>, key, 'cpu', numel) BINPERSID
  Pickle& storage(const std::string& type, const std::string& key, int64_t numel) {
    mark().str("storage").global("torch", type).str(key).str("cpu").integer(numel).tuple();
    return op('Q');
  }
};

struct TensorSpec {
  std::string name, type, key;
  int64_t numel, offset;
  std::vector<int64_t> shape, stride;
};

// What torch.save emits for an OrderedDict of tensors (without the memo, which is optional).
Pickle state_dict_pickle(const std::vector<TensorSpec>& specs) {
  Pickle p;
  p.proto().ordered_dict().mark();
  for (auto& t : specs) {
    p.str(t.name).global("torch._utils", "_rebuild_tensor_v2").mark();
    p.storage(t.type, t.key, t.numel).integer(t.offset).ints(t.shape).ints(t.stride).op(0x89).ordered_dict();
    p.tuple().op('R');
  }
  return p.op('u').stop();
}

struct ZipItem {
  std::string name, data;
  uint16_t method = 0;
};

// Little-endian fields of the given widths, e.g. {{0x04034b50, 4}, {20, 2}}.
void put_fields(std::string& b, std::initializer_list<std::pair<uint64_t, int>> fields) {
  for (auto& [v, n] : fields) put_le(b, v, n);
}

// A zip archive of stored entries, as torch.save writes it (without the alignment padding). With `zip64`, the
// central directory keeps sizes and offsets in ZIP64 extra fields and the end record points to a ZIP64 one.
std::string make_zip(const std::vector<ZipItem>& items, bool zip64 = false) {
  const uint64_t big = zip64 ? 0xffffffffu : 0;
  std::string out, cd;
  for (auto& it : items) {
    uint64_t crc = opt::detail::crc32(reinterpret_cast<const std::byte*>(it.data.data()), it.data.size());
    uint64_t off = out.size(), n = it.data.size(), nlen = it.name.size();
    // local header: signature, version, flags, method, time+date, crc, sizes, name and extra lengths
    put_fields(out, {{0x04034b50, 4}, {20, 2}, {0, 2}, {it.method, 2}, {0, 4}, {crc, 4}, {n, 4}, {n, 4}, {nlen, 2},
                     {0, 2}});
    out += it.name + it.data;
    // central directory: as above plus version made by, comment length, disk, attributes, local header offset
    put_fields(cd, {{0x02014b50, 4}, {20, 2}, {20, 2}, {0, 2}, {it.method, 2}, {0, 4}, {crc, 4}, {big ? big : n, 4},
                    {big ? big : n, 4}, {nlen, 2}, {zip64 ? 28u : 0u, 2}, {0, 2}, {0, 2}, {0, 2}, {0, 4},
                    {big ? big : off, 4}});
    cd += it.name;
    if (zip64) put_fields(cd, {{0x0001, 2}, {24, 2}, {n, 8}, {n, 8}, {off, 8}});
  }
  uint64_t cd_off = out.size(), count = items.size();
  out += cd;
  if (zip64) {
    uint64_t z = out.size();
    put_fields(out, {{0x06064b50, 4}, {44, 8}, {45, 2}, {45, 2}, {0, 4}, {0, 4}, {count, 8}, {count, 8},
                     {cd.size(), 8}, {cd_off, 8}});
    put_fields(out, {{0x07064b50, 4}, {0, 4}, {z, 8}, {1, 4}});
    put_fields(out, {{0x06054b50, 4}, {0, 4}, {0xffff, 2}, {0xffff, 2}, {big, 4}, {big, 4}, {0, 2}});
  } else {
    put_fields(out, {{0x06054b50, 4}, {0, 4}, {count, 2}, {count, 2}, {cd.size(), 4}, {cd_off, 4}, {0, 2}});
  }
  return out;
}

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// An archive holding `pkl` and the given storage records.
std::string archive(const std::string& pkl, const std::vector<std::pair<std::string, std::string>>& records) {
  std::vector<ZipItem> items{{"archive/data.pkl", pkl}};
  for (auto& [key, bytes] : records) items.push_back({"archive/data/" + key, bytes});
  items.push_back({"archive/version", "3\n"});
  return make_zip(items);
}

std::string error_of(const std::string& bytes) {
  try {
    opt::PytorchFile::from_bytes(bytes, "hostile.bin");
  } catch (const opt::format_error& e) {
    return e.what();
  } catch (const opt::error& e) {
    return std::string("(not a format_error) ") + e.what();
  }
  return "(no error)";
}

std::string pickle_error_of(const std::string& pkl) {
  try {
    opt::detail::unpickle_state_dict(pkl, "hostile.pkl");
  } catch (const opt::format_error& e) {
    return e.what();
  } catch (const opt::error& e) {
    return std::string("(not a format_error) ") + e.what();
  }
  return "(no error)";
}

// Literals may hold NUL bytes: keep their full length.
template <size_t N>
std::string error_of(const char (&s)[N]) {
  return error_of(std::string(s, N - 1));
}
template <size_t N>
std::string pickle_error_of(const char (&s)[N]) {
  return pickle_error_of(std::string(s, N - 1));
}

std::string read_file(const fs::path& p) { return opt_test::read_text(p); }

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() / ("opt_test_pytorch_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void check_same_tensors(const std::vector<const opt::TensorView*>& got, const opt::Checkpoint& want) {
  REQUIRE(got.size() == want.tensors().size());
  for (const opt::TensorView* t : got) {
    const opt::TensorView* w = want.find(t->name);
    REQUIRE_MESSAGE(w, "unexpected tensor " << t->name);
    CHECK_MESSAGE(t->type == w->type, t->name);
    CHECK_MESSAGE(t->shape == w->shape, t->name);
    REQUIRE_MESSAGE(t->nbytes == w->nbytes, t->name);
    CHECK_MESSAGE(std::memcmp(t->data, w->data, t->nbytes) == 0, t->name << ": bytes differ");
  }
}

const fs::path hub() { return opt_test::fixture_dir("opt-tiny-preln-hubstyle"); }

}  // namespace

TEST_CASE("pytorch_model.bin of the hub-style fixture equals its model.safetensors, bit for bit") {
  opt::PytorchOptions o;
  o.verify_crc = true;
  opt::PytorchFile f = opt::PytorchFile::open(hub() / "pytorch_model.bin", o);
  opt::Checkpoint st = opt::Checkpoint::open(hub() / "model.safetensors");
  CHECK(f.tensors().size() == 36);
  CHECK(f.copied_bytes() == 0);  // every tensor is contiguous: zero-copy views into the mapping
  std::vector<const opt::TensorView*> views;
  for (auto& t : f.tensors()) views.push_back(&t);
  check_same_tensors(views, st);
  const opt::TensorView* e = f.find("decoder.embed_positions.weight");
  REQUIRE(e);
  CHECK(e->type == opt::dtype::F16);
  CHECK(e->shape == std::vector<int64_t>{66, 64});
  CHECK(f.find("lm_head.weight") == nullptr);

  // The directory form finds pytorch_model.bin.
  opt::PytorchCheckpoint c = opt::PytorchCheckpoint::open(hub());
  check_same_tensors(c.tensors(), st);
}

TEST_CASE("hand-built archives: strided views, shared storages, parameters, big ints, memo opcodes") {
  // Storage "0": 6 floats. "w" is its first 2x3 rows (contiguous), "wt" the transpose (strided -> copied),
  // "tail" a 1-D view at offset 4, "p" a Parameter over storage "1", "empty" a 0x3 tensor.
  std::vector<float> s0 = {0, 1, 2, 3, 4, 5}, s1 = {7, 8};
  Pickle p;
  p.proto().op('}').op(0x94).mark();  // EMPTY_DICT MEMOIZE (protocol 4 style) MARK
  p.op(0x8c).op(1).b += "w";          // SHORT_BINUNICODE
  p.global("torch._utils", "_rebuild_tensor_v2").op('q').op(1).mark();
  p.storage("FloatStorage", "0", 6).op('q').op(2).integer(0).ints({2, 3}).ints({3, 1}).op(0x89).ordered_dict();
  p.tuple().op('R');
  p.str("wt").op('h').op(1).mark().op('h').op(2).integer(0).ints({3, 2}).ints({1, 3}).op(0x88).ordered_dict();
  p.tuple().op('R');
  p.str("tail").op('h').op(1).mark().op('h').op(2).integer(4).ints({2}).ints({1}).op(0x89).ordered_dict();
  p.tuple().op('R');
  p.str("p").global("torch._utils", "_rebuild_parameter").mark();
  p.op('h').op(1).mark().storage("FloatStorage", "1", 2).integer(0).ints({2}).ints({1}).op(0x89).ordered_dict();
  p.tuple().op('R').op(0x88).ordered_dict().tuple().op('R');
  p.str("empty").op('h').op(1).mark().op('h').op(2).op(0x8a).op(0).ints({0, 3}).ints({3, 1}).op(0x89).op('}');
  p.op('N').tuple().op('R');  // 7 arguments: metadata None
  p.op('u').stop();
  opt::PytorchFile f = opt::PytorchFile::from_bytes(archive(p.b, {{"0", floats(s0)}, {"1", floats(s1)}}));
  REQUIRE(f.tensors().size() == 5);
  auto values = [&](const char* name) {
    const opt::TensorView* t = f.find(name);
    REQUIRE(t);
    std::vector<float> v(t->numel());
    REQUIRE(t->nbytes == v.size() * 4);
    if (!v.empty()) std::memcpy(v.data(), t->data, t->nbytes);
    return v;
  };
  CHECK(values("w") == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(values("wt") == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(values("tail") == std::vector<float>{4, 5});
  CHECK(values("p") == std::vector<float>{7, 8});
  CHECK(values("empty").empty());
  CHECK(f.find("empty")->shape == std::vector<int64_t>{0, 3});
  CHECK(f.copied_bytes() == 24);  // only the transpose
  CHECK(f.tensors()[0].name == "w");  // pickle order

  // Every storage type maps to its dtype; LONG1 carries large numbers.
  Pickle q = state_dict_pickle({{"h", "HalfStorage", "0", 2, 0, {2}, {1}},
                                {"b", "BFloat16Storage", "1", 2, 0, {2}, {1}},
                                {"l", "LongStorage", "2", 1, 0, {1}, {1}},
                                {"u", "ByteStorage", "3", 3, 0, {3}, {1}},
                                {"z", "BoolStorage", "4", 1, 0, {}, {}}});
  opt::PytorchFile g = opt::PytorchFile::from_bytes(
      archive(q.b, {{"0", "abcd"}, {"1", "efgh"}, {"2", "12345678"}, {"3", "xyz"}, {"4", "\x01"}}));
  CHECK(g.find("h")->type == opt::dtype::F16);
  CHECK(g.find("b")->type == opt::dtype::BF16);
  CHECK(g.find("l")->type == opt::dtype::I64);
  CHECK(g.find("u")->type == opt::dtype::U8);
  CHECK(g.find("z")->type == opt::dtype::BOOL);
  CHECK(g.find("z")->shape.empty());
  CHECK(g.find("z")->nbytes == 1);
}

TEST_CASE("a forbidden GLOBAL is rejected before anything runs, naming it, the offset and the opcode") {
  for (auto [module, name] : {std::pair<std::string, std::string>{"os", "system"}, {"builtins", "eval"},
                              {"posix", "system"}, {"torch", "load"}, {"torch._utils", "_rebuild_qtensor"},
                              {"collections", "OrderedDictx"}}) {
    Pickle p;
    p.proto().global(module, name).str("echo pwned").op(0x85).op('R').stop();
    std::string msg = error_of(archive(p.b, {}));
    CAPTURE(msg);
    CHECK(msg.find("[opt.format] hostile.bin: archive/data.pkl: pickle offset 2, opcode 0x63 GLOBAL") == 0);
    CHECK(msg.find("forbidden global '" + module + "." + name + "'") != std::string::npos);
  }
  // Control bytes in a global's name are not echoed raw.
  Pickle p;
  p.proto().global("os\x1b[31m", "system").stop();
  CHECK(pickle_error_of(p.b).find("forbidden global 'os?[31m.system'") != std::string::npos);
  // The classic payload: protocol-0 INST, STACK_GLOBAL, NEWOBJ, OBJ are not allowed at all.
  CHECK(pickle_error_of("\x80\x02(ios\nsystem\nX\x02\x00\x00\x00ls.").find("opcode 0x69 INST: opcode not allowed") !=
        std::string::npos);
  CHECK(pickle_error_of(std::string("\x80\x04\x8c\x02os\x8c\x06system\x93.", 17)).find("STACK_GLOBAL") !=
        std::string::npos);
  // REDUCE of something that is not an allowed callable.
  Pickle r;
  r.proto().str("x").op(')').op('R').stop();
  CHECK(pickle_error_of(r.b).find("REDUCE can only call an allowed global, not a str") != std::string::npos);
  Pickle s;
  s.proto().global("torch", "FloatStorage").op(')').op('R').stop();
  CHECK(pickle_error_of(s.b).find("torch.FloatStorage cannot be called") != std::string::npos);
}

TEST_CASE("truncated zips and truncated pickles are format errors") {
  const std::string bin = read_file(hub() / "pytorch_model.bin");
  // Cut at many points, including inside the central directory and the end record.
  for (size_t cut = 0; cut < bin.size(); cut += (cut + 200 > bin.size() ? 1 : 4999)) {
    std::string msg = error_of(bin.substr(0, cut));
    CAPTURE(cut);
    CHECK(msg.rfind("[opt.format] hostile.bin: ", 0) == 0);
  }
  CHECK(error_of(bin.substr(0, 10)).find("too short for a zip archive") != std::string::npos);
  CHECK(error_of(bin.substr(0, bin.size() - 1)).find("no end of central directory") != std::string::npos);

  // Every proper prefix of the real data.pkl is rejected (never a crash, never a partial state dict).
  opt::detail::ZipArchive zip(reinterpret_cast<const std::byte*>(bin.data()), bin.size(), "fixture");
  const opt::detail::ZipEntry* e = zip.find("pytorch_model/data.pkl");
  REQUIRE(e);
  std::string pkl(zip.read(*e, true));
  CHECK(opt::detail::unpickle_state_dict(pkl, "ok").tensors.size() == 36);
  for (size_t cut = 0; cut < pkl.size(); ++cut) {
    std::string msg = pickle_error_of(pkl.substr(0, cut));
    CAPTURE(cut);
    CHECK(msg.rfind("[opt.format] hostile.pkl: pickle offset ", 0) == 0);
  }
  CHECK(pickle_error_of(pkl.substr(0, 100)).find("truncated pickle") != std::string::npos);
  CHECK(pickle_error_of(pkl.substr(0, pkl.size() - 1)).find("no STOP opcode") != std::string::npos);

  // A storage record whose bytes were cut (the central directory still claims the full size).
  std::string a = archive(state_dict_pickle({{"w", "FloatStorage", "0", 4, 0, {4}, {1}}}).b,
                          {{"0", floats({1, 2, 3, 4})}});
  CHECK(error_of(a).find("(no error)") == 0);
  std::string corrupt = a;
  corrupt[corrupt.find("archive/data/0") + 14] ^= 0x40;  // flip a bit of the weights: CRC catches it
  opt::PytorchOptions o;
  o.verify_crc = true;
  CHECK_THROWS_WITH_AS(opt::PytorchFile::from_bytes(corrupt, "c.bin", o), doctest::Contains("has CRC-32"),
                       opt::format_error);
}

TEST_CASE("storages: bad keys, missing records, wrong record sizes, views beyond the storage") {
  auto one = [](TensorSpec t, std::vector<std::pair<std::string, std::string>> recs) {
    return error_of(archive(state_dict_pickle({t}).b, recs));
  };
  const std::string four = floats({1, 2, 3, 4});
  CHECK(one({"w", "FloatStorage", "../../etc/passwd", 4, 0, {4}, {1}}, {{"0", four}})
            .find("bad storage key '../../etc/passwd'") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "", 4, 0, {4}, {1}}, {}).find("bad storage key of 0 bytes") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "7", 4, 0, {4}, {1}}, {{"0", four}})
            .find("storage key '7' has no record 'archive/data/7'") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 5, 0, {4}, {1}}, {{"0", four}})
            .find("storage '0' holds 5 F32 elements but its record 'archive/data/0' has 16 bytes") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {5}, {1}}, {{"0", four}})
            .find("tensor 'w' (F32 [5], offset 0, stride [1]) reaches element 4 but its storage '0' has 4 elements") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 2, {2, 2}, {2, 1}}, {{"0", four}}).find("reaches element 5") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {2, 2}, {1, 3}}, {{"0", four}}).find("reaches element 4") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 5, {0}, {1}}, {{"0", four}}).find("starts past the end") !=
        std::string::npos);
  // Sizes that overflow 64 bits.
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {INT64_MAX, INT64_MAX}, {0, 0}}, {{"0", four}})
            .find("has too many elements") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {2}, {INT64_MAX}}, {{"0", four}}).find("reaches element") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", INT64_MAX, 0, {1}, {1}}, {{"0", four}}).find("but its record") !=
        std::string::npos);
  // A broadcast view (stride 0) bigger than the whole file would be copied: refused as a limit.
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {1000, 1000}, {0, 1}}, {{"0", four}}).find("reaches element") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 1, 0, {100000, 1000}, {0, 0}}, {{"0", floats({1})}})
            .find("(not a format_error) [opt.limit]") == 0);
  // numel * element size wraps around 2^64: caught before any copy is sized from it.
  CHECK(one({"w", "FloatStorage", "0", 1, 0, {int64_t(1) << 62}, {0}}, {{"0", floats({1})}})
            .find("has more bytes than memory can address") != std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 1, 0, {int64_t(1) << 61}, {0}}, {{"0", floats({1})}})
            .find("(not a format_error) [opt.limit]") == 0);
  // Negative numbers, mismatched ranks.
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {-1}, {1}}, {{"0", four}}).find("holds a negative number -1") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, -1, {4}, {1}}, {{"0", four}}).find("negative storage offset") !=
        std::string::npos);
  CHECK(one({"w", "FloatStorage", "0", 4, 0, {4}, {1, 1}}, {{"0", four}}).find("stride has 2") != std::string::npos);
  // One key used with two dtypes.
  std::string two = archive(state_dict_pickle({{"a", "FloatStorage", "0", 4, 0, {4}, {1}},
                                               {"b", "HalfStorage", "0", 8, 0, {8}, {1}}}).b,
                            {{"0", four}});
  CHECK(error_of(two).find("storage '0' is used as F32 x 4 and as F16 x 8") != std::string::npos);
  // Duplicate names.
  std::string dup = archive(state_dict_pickle({{"a", "FloatStorage", "0", 4, 0, {4}, {1}},
                                               {"a", "FloatStorage", "0", 4, 0, {4}, {1}}}).b,
                            {{"0", four}});
  CHECK(error_of(dup).find("state dict key 'a' appears twice") != std::string::npos);
}

TEST_CASE("unknown opcodes, wrong types, underflow and deep nesting are format errors") {
  CHECK(pickle_error_of("\x80\x02\xff.").find("pickle offset 2, opcode 0xff (unknown): unknown opcode") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02G\x00\x00\x00\x00\x00\x00\x00\x00.").find("BINFLOAT: opcode not allowed") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x09.").find("unsupported pickle protocol 9") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02R").find("opcode 0x52 REDUCE: stack underflow") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02.").find("STOP: stack underflow") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02(t").find("(no error)") != 0);
  CHECK(pickle_error_of("\x80\x02(}.").find("STOP with an open MARK") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02h\x05").find("memo key 5 was never stored") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02}K\x01" "a.").find("APPEND target must be a list, found a dict") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02]K\x01K\x02s.").find("SETITEM target must be a dict, found a list") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02]N\x62.").find("BUILD is only allowed on an OrderedDict") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02X\x02\x00\x00\x00\xc3\x28.").find("not valid UTF-8") != std::string::npos);
  CHECK(pickle_error_of("\x80\x02X\xff\xff\xff\xff").find("truncated pickle: string of 4294967295 bytes") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02K\x01.").find("the pickled object is a int, expected a dict of tensors") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02}X\x01\x00\x00\x00" "aK\x01s.").find("state dict entry 'a' is a int, expected a tensor") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02\x8a\x09").find("LONG1 of 9 bytes") != std::string::npos);
  // A persistent id that is not a storage tuple.
  CHECK(pickle_error_of("\x80\x02X\x01\x00\x00\x00xQ.").find("BINPERSID: persistent id must be a 5-tuple") !=
        std::string::npos);

  // Deep nesting: by MARKs, and by containers without marks.
  CHECK(pickle_error_of("\x80\x02" + std::string(100000, '(')).find("MARKs nested deeper than 64") !=
        std::string::npos);
  CHECK(pickle_error_of("\x80\x02)" + std::string(100000, '\x85')).find("nesting deeper than 64") !=
        std::string::npos);
  // Size limits: values created, and the pickle's length.
  CHECK(pickle_error_of("\x80\x02" + std::string(OPT_PICKLE_MAX_VALUES + 1, ')')).find("values (limit)") !=
        std::string::npos);
  CHECK(pickle_error_of(std::string(OPT_PICKLE_MAX_BYTES + 1, '.')).find("(not a format_error) [opt.limit]") == 0);
  // Lists that contain themselves (a cycle) are harmless: nothing walks them.
  CHECK(pickle_error_of("\x80\x02]q\x00h\x00\x61h\x00\x61.").find("the pickled object is a list") !=
        std::string::npos);
  // A billion-element memo index does not allocate.
  CHECK(pickle_error_of("\x80\x02Nr\xff\xff\xff\x7fj\xff\xff\xff\x7f.").find("the pickled object is a None") !=
        std::string::npos);
}

TEST_CASE("zip details: compressed, legacy and non-torch archives are refused clearly") {
  std::string pkl = state_dict_pickle({{"w", "FloatStorage", "0", 1, 0, {1}, {1}}}).b;
  std::string deflated = make_zip({{"archive/data.pkl", pkl, 8}, {"archive/data/0", floats({1})}});
  CHECK(error_of(deflated).find("zip entry 'archive/data.pkl' is compressed (method 8, deflate); only stored") !=
        std::string::npos);
  // ZIP64 end records and extra fields are followed.
  std::string z64 = make_zip({{"archive/data.pkl", pkl}, {"archive/data/0", floats({2.5f})}}, true);
  opt::PytorchFile f64 = opt::PytorchFile::from_bytes(z64, "zip64.bin");
  REQUIRE(f64.find("w"));
  float w;
  std::memcpy(&w, f64.find("w")->data, 4);
  CHECK(w == 2.5f);
  std::string z64bad = z64;
  z64bad[z64bad.size() - 22 - 20 + 8] ^= 0x01;  // the locator's pointer to the ZIP64 end record
  CHECK(error_of(z64bad).find("no ZIP64 end of central directory record") != std::string::npos);
  CHECK(error_of(make_zip({{"a/b.txt", "x"}})).find("without a <name>/data.pkl entry") != std::string::npos);
  CHECK(error_of(make_zip({{"a/data.pkl", pkl}, {"b/data.pkl", pkl}})).find("two pickles") != std::string::npos);
  CHECK(error_of(make_zip({{"a/data.pkl", pkl}, {"a/data.pkl", pkl}})).find("appears twice") != std::string::npos);
  CHECK(error_of(make_zip({{"a/data.pkl", pkl}, {"a/byteorder", "big"}})).find("byteorder is 'big'") !=
        std::string::npos);
  CHECK(error_of("\x80\x02\x8a\x0al\xfc\x9c" "F\xf9 j\xa8P\x19.").find("legacy torch.save format") != std::string::npos);
  CHECK(error_of(std::string(100, '\0')).find("not a zip archive") != std::string::npos);
  // A central directory claiming more entries than it can hold.
  std::string z = make_zip({{"a/data.pkl", pkl}});
  z[z.size() - 12] = char(0xff);  // entries in the EOCD
  z[z.size() - 11] = char(0x0f);
  CHECK(error_of(z).find("cannot hold") != std::string::npos);
  // A local header offset past the end.
  std::string z2 = make_zip({{"a/data.pkl", pkl}});
  size_t cd = z2.find(std::string("PK\x01\x02", 4));
  z2[cd + 42 + 3] = char(0x7f);
  CHECK(error_of(z2).find("local file header at offset") != std::string::npos);
}

TEST_CASE("random corruption of the fixture never crashes: it parses or throws opt::error") {
  const std::string bin = read_file(hub() / "pytorch_model.bin");
  opt::detail::ZipArchive zip(reinterpret_cast<const std::byte*>(bin.data()), bin.size(), "fixture");
  const std::string pkl(zip.read(*zip.find("pytorch_model/data.pkl"), false));
  const size_t pkl_at = size_t(zip.find("pytorch_model/data.pkl")->data_offset);
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = pkl;
    int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) m[rng() % m.size()] = char(rng() & 0xff);
    try {
      opt::detail::unpickle_state_dict(m, "fuzz");
    } catch (const opt::error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  for (int i = 0; i < 150; ++i) {
    std::string m = bin;
    // Mostly inside data.pkl (so the tensor checks run), sometimes in the zip structures at the end.
    size_t at = (i % 3) ? pkl_at + rng() % pkl.size() : bin.size() - 1 - rng() % 2600;
    m[at] = char(rng() & 0xff);
    try {
      opt::PytorchFile::from_bytes(m, "fuzz");
    } catch (const opt::error&) {
    }
  }
}

TEST_CASE("Model::load reads a folder with pytorch_model.bin alone, in place, to the same logits and ids") {
  TempDir d;
  fs::copy_file(hub() / "config.json", d.path / "config.json");
  fs::copy_file(hub() / "pytorch_model.bin", d.path / "pytorch_model.bin");
  const opt::Model from_bin = opt::Model::load(d.path);
  const opt::Model from_st = opt::Model::load(hub());  // safetensors when both are there
  CHECK(from_bin.tensor_prefix() == "decoder.");
  // both read every weight in place: the same bytes, so the same logits, bit for bit
  const std::vector<int32_t> ids = {2, 206, 317, 15, 500};
  opt::Workspace ws(1);
  opt::KvCache ka(from_bin.config(), 8), kb(from_st.config(), 8);
  opt::ForwardOptions fo;
  fo.all_logits = true;
  const opt::LogitsView a = from_bin.forward({{&ka, ids.data(), int64_t(ids.size())}}, ws, fo);
  const std::vector<float> la(a.data, a.data + a.rows * a.cols);
  const opt::LogitsView b = from_st.forward({{&kb, ids.data(), int64_t(ids.size())}}, ws, fo);
  REQUIRE(a.rows * a.cols == b.rows * b.cols);
  CHECK(std::memcmp(la.data(), b.data, la.size() * 4) == 0);
  // and the fixture's greedy generation
  const nlohmann::json g = opt_test::read_json(hub() / "goldens.json");
  for (const nlohmann::json& c : g.at("cases")) {
    if (!c.contains("generate")) continue;
    std::vector<std::vector<int32_t>> prompts;
    for (size_t r = 0; r < c.at("input_ids").size(); ++r) {
      std::vector<int32_t> p;
      for (size_t t = 0; t < c["input_ids"][r].size(); ++t)
        if (c["attention_mask"][r][t].get<int>()) p.push_back(c["input_ids"][r][t].get<int32_t>());
      prompts.push_back(p);
    }
    opt::GenerateOptions o;
    o.max_new_tokens = c["generate"].at("max_new_tokens").get<int64_t>();
    CHECK(opt::generate_ids(from_bin, prompts, o).sequences == opt::generate_ids(from_st, prompts, o).sequences);
    break;
  }
  // a folder with neither format
  fs::remove(d.path / "pytorch_model.bin");
  CHECK_THROWS_AS(opt::Model::load(d.path), opt::io_error);
}

TEST_CASE("PytorchCheckpoint reads shards listed by pytorch_model.bin.index.json") {
  TempDir d;
  std::string a = archive(state_dict_pickle({{"x", "FloatStorage", "0", 2, 0, {2}, {1}}}).b, {{"0", floats({1, 2})}});
  std::string b = archive(state_dict_pickle({{"y", "FloatStorage", "0", 1, 0, {1}, {1}}}).b, {{"0", floats({3})}});
  std::ofstream(d.path / "pytorch_model-00001-of-00002.bin", std::ios::binary) << a;
  std::ofstream(d.path / "pytorch_model-00002-of-00002.bin", std::ios::binary) << b;
  std::ofstream(d.path / "pytorch_model.bin.index.json")
      << R"({"metadata": {"total_size": 12}, "weight_map": {"x": "pytorch_model-00001-of-00002.bin",
            "y": "pytorch_model-00002-of-00002.bin"}})";
  opt::PytorchCheckpoint c = opt::PytorchCheckpoint::open(d.path);
  REQUIRE(c.tensors().size() == 2);
  REQUIRE(c.find("y"));
  float y;
  std::memcpy(&y, c.find("y")->data, 4);
  CHECK(y == 3.0f);

  // convert_checkpoint follows the index, too.
  TempDir out;
  opt::ConvertResult r = opt::convert_checkpoint(d.path, out.path);
  CHECK(r.source_format == "pytorch");
  CHECK(r.inputs.size() == 2);
  opt::SafetensorsFile st = opt::SafetensorsFile::open(out.path / "model.safetensors");
  CHECK(st.tensors().size() == 2);

  // An index naming a tensor its shard lacks, or a shard outside the directory.
  std::ofstream(d.path / "pytorch_model.bin.index.json")
      << R"({"weight_map": {"z": "pytorch_model-00001-of-00002.bin"}})";
  CHECK_THROWS_WITH_AS(opt::PytorchCheckpoint::open(d.path), doctest::Contains("which lacks it"), opt::tensor_error);
  std::ofstream(d.path / "pytorch_model.bin.index.json") << R"({"weight_map": {"z": "../x.bin"}})";
  CHECK_THROWS_WITH_AS(opt::PytorchCheckpoint::open(d.path), doctest::Contains("is not a plain file name"),
                       opt::format_error);
  // Two shards holding the same name.
  std::ofstream(d.path / "pytorch_model-00002-of-00002.bin", std::ios::binary) << a;
  std::ofstream(d.path / "pytorch_model.bin.index.json")
      << R"({"weight_map": {"x": "pytorch_model-00001-of-00002.bin", "x2": "pytorch_model-00002-of-00002.bin"}})";
  CHECK_THROWS_WITH_AS(opt::PytorchCheckpoint::open(d.path), doctest::Contains("is also in"), opt::format_error);
}

TEST_CASE("convert_checkpoint: pytorch_model.bin -> model.safetensors, bit-identical, with side files") {
  TempDir out;
  opt::ConvertResult r = opt::convert_checkpoint(hub(), out.path);
  CHECK(r.source_format == "pytorch");
  CHECK(r.tensors == 36);
  CHECK(r.written == std::vector<fs::path>{out.path / "model.safetensors"});
  CHECK(std::find(r.copied.begin(), r.copied.end(), "config.json") != r.copied.end());
  CHECK(std::find(r.copied.begin(), r.copied.end(), "generation_config.json") != r.copied.end());
  CHECK(read_file(out.path / "config.json") == read_file(hub() / "config.json"));
  opt::Checkpoint want = opt::Checkpoint::open(hub() / "model.safetensors");
  opt::Checkpoint got = opt::Checkpoint::open(out.path);
  check_same_tensors(got.tensors(), want);
  CHECK(got.files()[0].metadata().at("format") == "pt");
  // Here even the file is byte-identical: same names, order, header and data as safetensors' own writer.
  CHECK(read_file(out.path / "model.safetensors") == read_file(hub() / "model.safetensors"));

  // The file form, and a safetensors input, give the same tensors.
  TempDir out2, out3;
  opt::convert_checkpoint(hub() / "pytorch_model.bin", out2.path);
  check_same_tensors(opt::Checkpoint::open(out2.path).tensors(), want);
  opt::ConvertResult r3 = opt::convert_checkpoint(out.path / "model.safetensors", out3.path);
  CHECK(r3.source_format == "safetensors");
  check_same_tensors(opt::Checkpoint::open(out3.path).tensors(), want);
  // A safetensors input is never overwritten in place.
  CHECK_THROWS_AS(opt::convert_checkpoint(out.path, out.path), opt::input_error);
  CHECK_THROWS_AS(opt::convert_checkpoint(out.path / "missing", out2.path), opt::io_error);
  TempDir empty;
  CHECK_THROWS_WITH_AS(opt::convert_checkpoint(empty.path, out2.path), doctest::Contains("found none of"),
                       opt::io_error);
}

TEST_CASE("convert_checkpoint: casts (f32, bf16, back to f16) and shards") {
  opt::Checkpoint want = opt::Checkpoint::open(hub() / "model.safetensors");
  TempDir f32, back, bf16, shards;
  opt::ConvertOptions o;
  o.cast = opt::dtype::F32;
  opt::convert_checkpoint(hub(), f32.path, o);
  opt::Checkpoint wide = opt::Checkpoint::open(f32.path);
  nlohmann::json cfg = opt_test::read_json(f32.path / "config.json"), orig = opt_test::read_json(hub() / "config.json");
  CHECK(cfg["torch_dtype"] == "float32");
  cfg["torch_dtype"] = orig["torch_dtype"];
  CHECK(cfg == orig);  // nothing else changed
  for (const opt::TensorView* w : want.tensors()) {
    const opt::TensorView* t = wide.find(w->name);
    REQUIRE(t);
    CHECK(t->type == opt::dtype::F32);
    CHECK(t->shape == w->shape);
    for (size_t i = 0; i < w->numel(); ++i) {
      uint16_t h;
      float f;
      std::memcpy(&h, w->data + 2 * i, 2);
      std::memcpy(&f, t->data + 4 * i, 4);
      REQUIRE(opt::detail::f32_bits(f) == opt::detail::f32_bits(opt::detail::f16_to_f32(h)));
    }
  }
  // F16 -> F32 -> F16 is exact.
  o.cast = opt::dtype::F16;
  opt::convert_checkpoint(f32.path, back.path, o);
  check_same_tensors(opt::Checkpoint::open(back.path).tensors(), want);
  // BF16: each value rounded from its F32 widening.
  o.cast = opt::dtype::BF16;
  opt::convert_checkpoint(hub(), bf16.path, o);
  opt::Checkpoint narrow = opt::Checkpoint::open(bf16.path);
  const opt::TensorView* b = narrow.find("decoder.embed_tokens.weight");
  const opt::TensorView* w = want.find("decoder.embed_tokens.weight");
  REQUIRE(b);
  CHECK(b->type == opt::dtype::BF16);
  for (size_t i = 0; i < w->numel(); ++i) {
    uint16_t h, g;
    std::memcpy(&h, w->data + 2 * i, 2);
    std::memcpy(&g, b->data + 2 * i, 2);
    REQUIRE(g == opt::detail::f32_to_bf16(opt::detail::f16_to_f32(h)));
  }
  o.cast = opt::dtype::I8;
  CHECK_THROWS_AS(opt::convert_checkpoint(hub(), bf16.path, o), opt::input_error);

  // Shards of at most 40000 bytes (the 65536-byte embedding gets one of its own), read back through the index.
  opt::ConvertOptions s;
  s.max_shard_bytes = 40000;
  opt::ConvertResult r = opt::convert_checkpoint(hub(), shards.path, s);
  CHECK(r.written.size() > 3);
  CHECK(r.written.back() == shards.path / "model.safetensors.index.json");
  CHECK(!fs::exists(shards.path / "model.safetensors"));
  opt::Checkpoint sh = opt::Checkpoint::open(shards.path);
  CHECK(sh.files().size() == r.written.size() - 1);
  check_same_tensors(sh.tensors(), want);
  nlohmann::json idx = opt_test::read_json(shards.path / "model.safetensors.index.json");
  CHECK(idx["metadata"]["total_size"].get<uint64_t>() == r.bytes);
  // Converting again as one file replaces the index, so the folder is never ambiguous.
  opt::convert_checkpoint(hub(), shards.path);
  CHECK(!fs::exists(shards.path / "model.safetensors.index.json"));
  check_same_tensors(opt::Checkpoint::open(shards.path).tensors(), want);
}
