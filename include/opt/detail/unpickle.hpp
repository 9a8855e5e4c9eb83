// A restricted unpickler for the data.pkl of a torch.save archive: it understands exactly what a state dict
// needs and rejects everything else. Internal.
//
// Pickle is a small stack machine whose GLOBAL and REDUCE opcodes import and call arbitrary Python objects; a
// general unpickler runs code. This one never calls or constructs anything outside an allow-list:
//   collections.OrderedDict()                 -> an empty dict
//   torch._utils._rebuild_tensor_v2(...)      -> a tensor record (storage, offset, size, stride)
//   torch._utils._rebuild_parameter(t, ...)   -> t
//   torch.{Float,Half,BFloat16,Double,Long,Int,Short,Char,Byte,Bool}Storage  (only as a persistent-id tag)
// and a persistent id ('storage', <storage type>, key, location, numel) names a storage record of the archive.
// Opcodes: the protocol-2 subset torch.save emits (PROTO, MARK, EMPTY_DICT/LIST/TUPLE, DICT, LIST, TUPLE,
// TUPLE1-3, BINUNICODE, SHORT_BINUNICODE, BININT, BININT1, BININT2, LONG1, NONE, NEWTRUE, NEWFALSE, BINPUT,
// LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET, GLOBAL, BINPERSID, REDUCE, BUILD on a dict, SETITEM(S),
// APPEND(S), STOP). Any other opcode or global, a wrong argument type, a stack underflow, a truncated stream
// or an exceeded limit is an opt::format_error naming the archive, the byte offset and the opcode.
//
// Values live in one arena and refer to each other by index, so shared or cyclic references (BINGET) cost
// nothing and free nothing twice; nothing here recurses over values. Work and memory are linear in the input
// and capped by the limits below.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "opt/error.hpp"
#include "opt/safetensors.hpp"

// ---- limits (define before including to change) ----------------------------------------------------------
// Largest data.pkl accepted, in bytes.
#ifndef OPT_PICKLE_MAX_BYTES
#define OPT_PICKLE_MAX_BYTES (64u * 1024u * 1024u)
#endif
// Most values (strings, ints, tuples, ...) one pickle may create: about 25 per tensor in a torch state dict, so
// room for 40000 tensors; each costs under 100 bytes.
#ifndef OPT_PICKLE_MAX_VALUES
#define OPT_PICKLE_MAX_VALUES (1024u * 1024u)
#endif
// Deepest nesting of MARKs and of containers (a state dict needs 4).
#ifndef OPT_PICKLE_MAX_DEPTH
#define OPT_PICKLE_MAX_DEPTH 64u
#endif
// Most dimensions of one tensor.
#ifndef OPT_PICKLE_MAX_DIMS
#define OPT_PICKLE_MAX_DIMS 16u
#endif

OPT_NAMESPACE_BEGIN
namespace detail {

// A storage record of the archive (the file <archive>/data/<key>): `numel` elements of `type`.
struct PickleStorage {
  dtype type = dtype::F32;
  std::string key;
  std::string location;  // "cpu", "cuda:0", ... (informative)
  uint64_t numel = 0;
};

// One entry of the state dict: a strided view (in elements) of a storage.
struct PickleTensor {
  std::string name;
  size_t storage = 0;  // index into StateDict::storages
  int64_t offset = 0;
  std::vector<int64_t> shape, stride;
};

struct StateDict {
  std::vector<PickleStorage> storages;  // one per distinct key, in order of first use
  std::vector<PickleTensor> tensors;    // in pickle (insertion) order
};

inline const char* pickle_opcode_name(uint8_t op) noexcept {
  switch (op) {
    case 0x80: return "PROTO";
    case 0x95: return "FRAME";
    case '.': return "STOP";
    case '(': return "MARK";
    case '}': return "EMPTY_DICT";
    case ']': return "EMPTY_LIST";
    case ')': return "EMPTY_TUPLE";
    case 'd': return "DICT";
    case 'l': return "LIST";
    case 't': return "TUPLE";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 'X': return "BINUNICODE";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 'V': return "UNICODE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8e: return "BINBYTES8";
    case 0x96: return "BYTEARRAY8";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'M': return "BININT2";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'F': return "FLOAT";
    case 'G': return "BINFLOAT";
    case 'N': return "NONE";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 'p': return "PUT";
    case 0x94: return "MEMOIZE";
    case 'h': return "BINGET";
    case 'j': return "LONG_BINGET";
    case 'g': return "GET";
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 's': return "SETITEM";
    case 'u': return "SETITEMS";
    case 'a': return "APPEND";
    case 'e': return "APPENDS";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case '0': return "POP";
    case '2': return "DUP";
    case '1': return "POP_MARK";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF).
inline bool valid_utf8(std::string_view s) noexcept {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1fu;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0fu;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07u;
    else return false;
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0u) != 0x80u) return false;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

class Unpickler {
 public:
  // `bytes` is the pickle; `where` names it in messages (e.g. "model.bin: archive/data.pkl").
  Unpickler(std::string_view bytes, std::string where) : in_(bytes), where_(std::move(where)) {}

  StateDict run() {
    if (in_.size() > OPT_PICKLE_MAX_BYTES)
      throw limit_error(where_ + ": pickle of " + std::to_string(in_.size()) + " bytes exceeds the limit of " +
                        std::to_string(uint64_t(OPT_PICKLE_MAX_BYTES)) + " bytes");
    uint32_t root = execute();
    return interpret(root);
  }

 private:
  enum class Kind : uint8_t { none, boolean, integer, string, tuple, list, dict, global, storage, tensor };
  enum class Global : uint8_t { ordered_dict, rebuild_tensor_v2, rebuild_parameter, storage_type };
  // integer: i. string: s. tuple/list: items. dict: items = k0, v0, k1, v1, ... global: g (+ i = dtype for a
  // storage type). storage: i = index into storages_. tensor: i = offset, items = {storage, size, stride}.
  struct Value {
    Kind kind = Kind::none;
    Global g = Global::ordered_dict;
    uint32_t depth = 0;  // containers: 1 + the deepest element when it was added
    int64_t i = 0;
    std::string s;
    std::vector<uint32_t> items;
  };

  static const char* kind_name(Kind k) noexcept {
    switch (k) {
      case Kind::none: return "None";
      case Kind::boolean: return "bool";
      case Kind::integer: return "int";
      case Kind::string: return "str";
      case Kind::tuple: return "tuple";
      case Kind::list: return "list";
      case Kind::dict: return "dict";
      case Kind::global: return "global";
      case Kind::storage: return "storage";
      case Kind::tensor: return "tensor";
    }
    return "?";
  }

  [[noreturn]] void fail(const std::string& what) const {
    std::string op = "0x";
    static const char* hex = "0123456789abcdef";
    op.push_back(hex[op_ >> 4]);
    op.push_back(hex[op_ & 0xf]);
    const char* name = pickle_opcode_name(op_);
    throw format_error(where_ + ": pickle offset " + std::to_string(op_pos_) + ", opcode " + op +
                       (name ? std::string(" ") + name : std::string(" (unknown)")) + ": " + what);
  }

  // ---- input ------------------------------------------------------------------------------------------------
  std::string_view take(size_t n) {
    if (in_.size() - pos_ < n)
      fail("truncated pickle: needs " + std::to_string(n) + " more bytes, " + std::to_string(in_.size() - pos_) +
           " left");
    std::string_view v = in_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  uint64_t take_le(size_t n) {
    std::string_view b = take(n);
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[k]);
    return v;
  }
  std::string_view take_line() {  // GLOBAL's "module\n" and "name\n"
    size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail("truncated pickle: unterminated GLOBAL name");
    if (end - pos_ > 256) fail("GLOBAL name longer than 256 bytes");
    std::string_view v = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return v;
  }

  // ---- values and the stack --------------------------------------------------------------------------------
  uint32_t make(Kind k) {
    if (values_.size() >= OPT_PICKLE_MAX_VALUES)
      fail("more than " + std::to_string(uint64_t(OPT_PICKLE_MAX_VALUES)) + " values (limit)");
    values_.emplace_back();
    values_.back().kind = k;
    return uint32_t(values_.size() - 1);
  }
  uint32_t make_int(int64_t v) {
    uint32_t id = make(Kind::integer);
    values_[id].i = v;
    return id;
  }
  void push(uint32_t id) {
    if (stack_.size() >= OPT_PICKLE_MAX_VALUES) fail("stack deeper than the value limit");
    stack_.push_back(id);
  }
  uint32_t pop() {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) fail(marks_.empty() ? "stack underflow" : "stack underflow (reached a MARK)");
    uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t top() {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) fail("stack underflow");
    return stack_.back();
  }
  // Pops everything down to the last MARK, and the mark.
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + std::ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void add_child(uint32_t container, uint32_t child) {
    uint32_t d = values_[child].depth + 1;
    if (d > OPT_PICKLE_MAX_DEPTH) fail("nesting deeper than " + std::to_string(OPT_PICKLE_MAX_DEPTH) + " (limit)");
    if (d > values_[container].depth) values_[container].depth = d;
    values_[container].items.push_back(child);
  }
  uint32_t make_tuple(const std::vector<uint32_t>& items) {
    uint32_t id = make(Kind::tuple);
    values_[id].depth = 1;
    for (uint32_t c : items) add_child(id, c);
    return id;
  }
  const Value& expect(uint32_t id, Kind k, const char* what) {
    if (values_[id].kind != k)
      fail(std::string(what) + " must be a " + kind_name(k) + ", found a " + kind_name(values_[id].kind));
    return values_[id];
  }
  int64_t expect_int(uint32_t id, const char* what) { return expect(id, Kind::integer, what).i; }

  uint32_t memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("memo key " + std::to_string(key) + " was never stored");
    return it->second;
  }
  void memo_put(uint64_t key) {
    uint32_t v = top();
    memo_[key] = v;
  }

  uint32_t make_global(std::string_view module, std::string_view name) {
    static constexpr struct {
      const char* name;
      dtype type;
    } storages[] = {{"FloatStorage", dtype::F32},  {"HalfStorage", dtype::F16},  {"BFloat16Storage", dtype::BF16},
                    {"DoubleStorage", dtype::F64}, {"LongStorage", dtype::I64},  {"IntStorage", dtype::I32},
                    {"ShortStorage", dtype::I16},  {"CharStorage", dtype::I8},   {"ByteStorage", dtype::U8},
                    {"BoolStorage", dtype::BOOL}};
    uint32_t id = UINT32_MAX;
    if (module == "collections" && name == "OrderedDict") {
      id = make(Kind::global);
      values_[id].g = Global::ordered_dict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      id = make(Kind::global);
      values_[id].g = Global::rebuild_tensor_v2;
    } else if (module == "torch._utils" && name == "_rebuild_parameter") {
      id = make(Kind::global);
      values_[id].g = Global::rebuild_parameter;
    } else if (module == "torch") {
      for (auto& s : storages)
        if (name == s.name) {
          id = make(Kind::global);
          values_[id].g = Global::storage_type;
          values_[id].i = int64_t(s.type);
        }
    }
    if (id == UINT32_MAX) {
      std::string shown;  // printable, bounded
      for (char c : std::string(module) + "." + std::string(name))
        shown.push_back(static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f ? c : '?');
      fail("forbidden global '" + shown +
           "' (allowed: collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter, "
           "torch.<Type>Storage)");
    }
    values_[id].s = std::string(name);
    return id;
  }

  // BINPERSID: ('storage', storage type, key, location, numel) -> a storage value.
  uint32_t persistent_load(uint32_t pid) {
    if (values_[pid].kind != Kind::tuple || values_[pid].items.size() != 5)
      fail("persistent id must be a 5-tuple ('storage', type, key, location, numel)");
    std::vector<uint32_t> f = values_[pid].items;
    if (values_[f[0]].kind != Kind::string || values_[f[0]].s != "storage")
      fail("persistent id must start with 'storage'");
    const Value& type = values_[f[1]];
    if (type.kind != Kind::global || type.g != Global::storage_type)
      fail("persistent id's storage type must be a torch.<Type>Storage global, found a " + std::string(kind_name(type.kind)));
    const std::string& key = expect(f[2], Kind::string, "storage key").s;
    if (key.empty() || key.size() > 64) fail("bad storage key of " + std::to_string(key.size()) + " bytes");
    for (char c : key)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-'))
        fail("bad storage key '" + printable(key) + "' (expected letters, digits, '_' or '-')");
    const std::string& loc = expect(f[3], Kind::string, "storage location").s;
    int64_t numel = expect_int(f[4], "storage numel");
    if (numel < 0) fail("storage '" + key + "' has negative numel " + std::to_string(numel));
    dtype t = dtype(type.i);
    auto it = storage_index_.find(key);
    size_t idx;
    if (it == storage_index_.end()) {
      idx = storages_.size();
      storages_.push_back({t, key, loc, uint64_t(numel)});
      storage_index_.emplace(key, idx);
    } else {
      idx = it->second;
      const PickleStorage& s = storages_[idx];
      if (s.type != t || s.numel != uint64_t(numel))
        fail("storage '" + key + "' is used as " + to_string(s.type) + " x " + std::to_string(s.numel) + " and as " +
             to_string(t) + " x " + std::to_string(numel));
    }
    uint32_t id = make(Kind::storage);
    values_[id].i = int64_t(idx);
    return id;
  }

  static std::string printable(const std::string& s) {
    std::string out;
    for (char c : s.substr(0, 64))
      out.push_back(static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f ? c : '?');
    return out;
  }

  // A tuple of non-negative ints (size or stride).
  void check_dims(uint32_t id, const char* what) {
    const Value& v = expect(id, Kind::tuple, what);
    if (v.items.size() > OPT_PICKLE_MAX_DIMS)
      fail(std::string(what) + " has " + std::to_string(v.items.size()) + " dimensions, more than " +
           std::to_string(OPT_PICKLE_MAX_DIMS));
    for (uint32_t d : v.items)
      if (expect_int(d, what) < 0) fail(std::string(what) + " holds a negative number " + std::to_string(values_[d].i));
  }

  uint32_t reduce(uint32_t callable, uint32_t args) {
    const Value& c = values_[callable];
    if (c.kind != Kind::global) fail(std::string("REDUCE can only call an allowed global, not a ") + kind_name(c.kind));
    std::vector<uint32_t> a = expect(args, Kind::tuple, "REDUCE arguments").items;
    switch (c.g) {
      case Global::ordered_dict: {
        if (!a.empty()) fail("collections.OrderedDict takes no arguments here, found " + std::to_string(a.size()));
        uint32_t id = make(Kind::dict);
        values_[id].depth = 1;
        return id;
      }
      case Global::rebuild_tensor_v2: {
        // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        if (a.size() != 6 && a.size() != 7)
          fail("_rebuild_tensor_v2 takes 6 or 7 arguments, found " + std::to_string(a.size()));
        expect(a[0], Kind::storage, "_rebuild_tensor_v2 storage");
        int64_t offset = expect_int(a[1], "_rebuild_tensor_v2 storage_offset");
        if (offset < 0) fail("negative storage offset " + std::to_string(offset));
        check_dims(a[2], "_rebuild_tensor_v2 size");
        check_dims(a[3], "_rebuild_tensor_v2 stride");
        if (values_[a[2]].items.size() != values_[a[3]].items.size())
          fail("_rebuild_tensor_v2 size has " + std::to_string(values_[a[2]].items.size()) + " dimensions but stride has " +
               std::to_string(values_[a[3]].items.size()));
        expect(a[4], Kind::boolean, "_rebuild_tensor_v2 requires_grad");
        expect(a[5], Kind::dict, "_rebuild_tensor_v2 backward_hooks");
        if (!values_[a[5]].items.empty()) fail("_rebuild_tensor_v2 backward_hooks must be empty");
        if (a.size() == 7 && values_[a[6]].kind != Kind::none && values_[a[6]].kind != Kind::dict)
          fail(std::string("_rebuild_tensor_v2 metadata must be None or a dict, found a ") + kind_name(values_[a[6]].kind));
        uint32_t id = make(Kind::tensor);
        values_[id].i = offset;
        values_[id].items = {a[0], a[2], a[3]};
        values_[id].depth = 2;
        return id;
      }
      case Global::rebuild_parameter: {
        // (data, requires_grad, backward_hooks)
        if (a.size() != 3) fail("_rebuild_parameter takes 3 arguments, found " + std::to_string(a.size()));
        expect(a[0], Kind::tensor, "_rebuild_parameter data");
        expect(a[1], Kind::boolean, "_rebuild_parameter requires_grad");
        expect(a[2], Kind::dict, "_rebuild_parameter backward_hooks");
        return a[0];
      }
      case Global::storage_type: break;
    }
    fail("torch." + c.s + " cannot be called (it is only a storage type tag)");
  }

  // ---- the machine ----------------------------------------------------------------------------------------
  uint32_t execute() {
    for (;;) {
      op_pos_ = pos_;
      if (pos_ >= in_.size()) {
        op_ = 0;
        fail("truncated pickle: no STOP opcode");
      }
      op_ = static_cast<uint8_t>(in_[pos_++]);
      switch (op_) {
        case 0x80: {  // PROTO
          uint64_t v = take_le(1);
          if (v < 2 || v > 5) fail("unsupported pickle protocol " + std::to_string(v));
          break;
        }
        case '.': {  // STOP
          uint32_t root = pop();
          if (!marks_.empty()) fail("STOP with an open MARK");
          return root;
        }
        case '(':  // MARK
          if (marks_.size() >= OPT_PICKLE_MAX_DEPTH)
            fail("MARKs nested deeper than " + std::to_string(OPT_PICKLE_MAX_DEPTH) + " (limit)");
          marks_.push_back(stack_.size());
          break;
        case '}': {  // EMPTY_DICT
          uint32_t id = make(Kind::dict);
          values_[id].depth = 1;
          push(id);
          break;
        }
        case ']': {  // EMPTY_LIST
          uint32_t id = make(Kind::list);
          values_[id].depth = 1;
          push(id);
          break;
        }
        case ')': push(make_tuple({})); break;  // EMPTY_TUPLE
        case 't': push(make_tuple(pop_mark())); break;
        case 0x85: {  // TUPLE1
          uint32_t a = pop();
          push(make_tuple({a}));
          break;
        }
        case 0x86: {  // TUPLE2
          uint32_t b = pop(), a = pop();
          push(make_tuple({a, b}));
          break;
        }
        case 0x87: {  // TUPLE3
          uint32_t c = pop(), b = pop(), a = pop();
          push(make_tuple({a, b, c}));
          break;
        }
        case 'l': {  // LIST
          std::vector<uint32_t> items = pop_mark();
          uint32_t id = make(Kind::list);
          values_[id].depth = 1;
          for (uint32_t x : items) add_child(id, x);
          push(id);
          break;
        }
        case 'd': {  // DICT
          std::vector<uint32_t> items = pop_mark();
          if (items.size() % 2) fail("DICT needs key/value pairs, found an odd number of items");
          uint32_t id = make(Kind::dict);
          values_[id].depth = 1;
          for (uint32_t x : items) add_child(id, x);
          push(id);
          break;
        }
        case 'X':     // BINUNICODE
        case 0x8c: {  // SHORT_BINUNICODE
          uint64_t n = take_le(op_ == 'X' ? 4 : 1);
          if (n > in_.size() - pos_)
            fail("truncated pickle: string of " + std::to_string(n) + " bytes, " + std::to_string(in_.size() - pos_) +
                 " left");
          std::string_view s = take(size_t(n));
          if (!valid_utf8(s)) fail("string is not valid UTF-8");
          uint32_t id = make(Kind::string);
          values_[id].s = std::string(s);
          push(id);
          break;
        }
        case 'J': push(make_int(int64_t(int32_t(uint32_t(take_le(4)))))); break;  // BININT
        case 'K': push(make_int(int64_t(take_le(1)))); break;                      // BININT1
        case 'M': push(make_int(int64_t(take_le(2)))); break;                      // BININT2
        case 0x8a: {                                                               // LONG1
          uint64_t n = take_le(1);
          if (n > 8) fail("LONG1 of " + std::to_string(n) + " bytes does not fit in 64 bits");
          uint64_t v = n ? take_le(size_t(n)) : 0;
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1u) v |= ~uint64_t(0) << (8 * n);  // sign-extend
          push(make_int(int64_t(v)));
          break;
        }
        case 'N': push(make(Kind::none)); break;
        case 0x88:    // NEWTRUE
        case 0x89: {  // NEWFALSE
          uint32_t id = make(Kind::boolean);
          values_[id].i = op_ == 0x88;
          push(id);
          break;
        }
        case 'q': memo_put(take_le(1)); break;          // BINPUT
        case 'r': memo_put(take_le(4)); break;          // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;       // MEMOIZE
        case 'h': push(memo_get(take_le(1))); break;    // BINGET
        case 'j': push(memo_get(take_le(4))); break;    // LONG_BINGET
        case 'c': {                                     // GLOBAL
          std::string_view module = take_line();
          std::string_view name = take_line();
          push(make_global(module, name));
          break;
        }
        case 'Q': push(persistent_load(pop())); break;  // BINPERSID
        case 'R': {                                     // REDUCE
          uint32_t args = pop(), callable = pop();
          push(reduce(callable, args));
          break;
        }
        case 'b': {  // BUILD: obj.__setstate__(state); only an OrderedDict's attributes (torch's _metadata)
          uint32_t state = pop();
          uint32_t obj = top();
          if (values_[obj].kind != Kind::dict)
            fail(std::string("BUILD is only allowed on an OrderedDict, found a ") + kind_name(values_[obj].kind));
          if (values_[state].kind != Kind::none && values_[state].kind != Kind::dict &&
              values_[state].kind != Kind::tuple)
            fail(std::string("BUILD state must be None, a dict or a tuple, found a ") + kind_name(values_[state].kind));
          break;  // the attributes are not part of the state dict: dropped
        }
        case 's': {  // SETITEM
          uint32_t v = pop(), k = pop();
          uint32_t d = top();
          expect(d, Kind::dict, "SETITEM target");
          add_child(d, k);
          add_child(d, v);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<uint32_t> items = pop_mark();
          if (items.size() % 2) fail("SETITEMS needs key/value pairs, found an odd number of items");
          uint32_t d = top();
          expect(d, Kind::dict, "SETITEMS target");
          for (uint32_t x : items) add_child(d, x);
          break;
        }
        case 'a': {  // APPEND
          uint32_t v = pop();
          uint32_t l = top();
          expect(l, Kind::list, "APPEND target");
          add_child(l, v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<uint32_t> items = pop_mark();
          uint32_t l = top();
          expect(l, Kind::list, "APPENDS target");
          for (uint32_t x : items) add_child(l, x);
          break;
        }
        default:
          fail(pickle_opcode_name(op_) ? "opcode not allowed in a torch state dict" : "unknown opcode");
      }
    }
  }

  // The root must be a dict of str -> tensor.
  StateDict interpret(uint32_t root) {
    op_ = '.';
    const Value& r = values_[root];
    if (r.kind != Kind::dict) fail(std::string("the pickled object is a ") + kind_name(r.kind) + ", expected a dict of tensors");
    StateDict out;
    std::unordered_map<std::string, size_t> seen;
    for (size_t k = 0; k + 1 < r.items.size(); k += 2) {
      const Value& key = values_[r.items[k]];
      const Value& val = values_[r.items[k + 1]];
      if (key.kind != Kind::string) fail(std::string("state dict key is a ") + kind_name(key.kind) + ", expected a str");
      if (val.kind != Kind::tensor)
        fail("state dict entry '" + printable(key.s) + "' is a " + kind_name(val.kind) + ", expected a tensor");
      if (!seen.emplace(key.s, k).second) fail("state dict key '" + printable(key.s) + "' appears twice");
      PickleTensor t;
      t.name = key.s;
      t.storage = size_t(values_[val.items[0]].i);
      t.offset = val.i;
      for (uint32_t d : values_[val.items[1]].items) t.shape.push_back(values_[d].i);
      for (uint32_t d : values_[val.items[2]].items) t.stride.push_back(values_[d].i);
      out.tensors.push_back(std::move(t));
    }
    out.storages = std::move(storages_);
    return out;
  }

  std::string_view in_;
  std::string where_;
  size_t pos_ = 0, op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<Value> values_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::vector<PickleStorage> storages_;
  std::unordered_map<std::string, size_t> storage_index_;
};

// Runs the restricted unpickler over a torch data.pkl. `where` names it in messages.
inline StateDict unpickle_state_dict(std::string_view bytes, const std::string& where) {
  return Unpickler(bytes, where).run();
}

}  // namespace detail
OPT_NAMESPACE_END
