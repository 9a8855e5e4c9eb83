// Reading a zip archive held in memory (a mapped file): end of central directory (ZIP64 too), central
// directory, local headers. Only STORED (uncompressed) entries can be read, zero-copy: that is what torch.save
// writes. Compressed or encrypted entries are listed but reading one is a format_error. Internal.
//
// Every offset and size is checked against the buffer before it is used, so a hostile archive can only produce
// an opt::format_error. Work and memory are linear in the size of the central directory.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "opt/error.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

// CRC-32 (IEEE 802.3, the zip one), table-driven.
inline uint32_t crc32(const std::byte* p, size_t n, uint32_t crc = 0) noexcept {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ std::to_integer<uint32_t>(p[i])) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

struct ZipEntry {
  std::string name;
  uint16_t method = 0;       // 0 = stored, 8 = deflate, ...
  uint16_t flags = 0;        // general purpose bits; bit 0 = encrypted
  uint32_t crc = 0;          // from the central directory
  uint64_t size = 0;         // uncompressed size
  uint64_t csize = 0;        // compressed size
  uint64_t header_offset = 0;  // of the local file header
  uint64_t data_offset = 0;    // of the entry's bytes (after the local header)
};

class ZipArchive {
 public:
  ZipArchive() = default;
  // Parses the archive in [base, base + size). The bytes must outlive the archive. `path` names it in messages.
  ZipArchive(const std::byte* base, size_t size, std::string path) : base_(base), size_(size), path_(std::move(path)) {
    parse();
  }

  const std::vector<ZipEntry>& entries() const noexcept { return entries_; }
  const ZipEntry* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  const std::string& path() const noexcept { return path_; }

  // The bytes of a stored entry, zero-copy. Throws for compressed or encrypted entries; with `verify_crc`,
  // checks the CRC-32 the central directory gives.
  std::string_view read(const ZipEntry& e, bool verify_crc) const {
    if (e.flags & 1u) throw format_error(path_ + ": zip entry '" + e.name + "' is encrypted");
    if (e.method != 0)
      throw format_error(path_ + ": zip entry '" + e.name + "' is compressed (method " + std::to_string(e.method) +
                         (e.method == 8 ? ", deflate" : "") +
                         "); only stored (uncompressed) entries are supported, which is what torch.save writes");
    const std::byte* p = base_ + e.data_offset;
    if (verify_crc) {
      uint32_t c = crc32(p, size_t(e.size));
      if (c != e.crc)
        throw format_error(path_ + ": zip entry '" + e.name + "' has CRC-32 " + hex32(c) + ", expected " + hex32(e.crc) +
                           " (the file is corrupt)");
    }
    return std::string_view(reinterpret_cast<const char*>(p), size_t(e.size));
  }
  const std::byte* data(const ZipEntry& e) const noexcept { return base_ + e.data_offset; }

 private:
  static std::string hex32(uint32_t v) {
    static const char* d = "0123456789abcdef";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s.push_back(d[(v >> (4 * i)) & 0xfu]);
    return s;
  }
  uint64_t le(uint64_t off, int n) const noexcept {  // caller checked bounds
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<uint64_t>(base_[off + uint64_t(i)]);
    return v;
  }
  void need(uint64_t off, uint64_t n, const char* what) const {
    if (off > size_ || n > size_ - off)
      throw format_error(path_ + ": truncated zip: " + what + " at offset " + std::to_string(off) + " needs " +
                         std::to_string(n) + " bytes, the file has " + std::to_string(size_));
  }

  void parse() {
    constexpr uint64_t kEocd = 22;
    if (size_ < kEocd)
      throw format_error(path_ + ": " + std::to_string(size_) +
                         " bytes is too short for a zip archive (no end of central directory record)");
    // The EOCD record is the last 22 bytes plus a comment of up to 65535 bytes: scan backwards for it.
    uint64_t eocd = UINT64_MAX;
    uint64_t lowest = size_ - kEocd > 65535 ? size_ - kEocd - 65535 : 0;
    for (uint64_t off = size_ - kEocd + 1; off-- > lowest;) {
      if (le(off, 4) == 0x06054b50u && off + kEocd + le(off + 20, 2) == size_) {
        eocd = off;
        break;
      }
    }
    if (eocd == UINT64_MAX)
      throw format_error(path_ + ": not a zip archive (no end of central directory record; truncated?)");
    uint64_t disk = le(eocd + 4, 2), cd_disk = le(eocd + 6, 2);
    uint64_t count = le(eocd + 10, 2), cd_size = le(eocd + 12, 4), cd_off = le(eocd + 16, 4);
    if (count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
      // ZIP64: a locator (20 bytes) just before the EOCD points at the ZIP64 EOCD record (56 bytes).
      if (eocd < 20 || le(eocd - 20, 4) != 0x07064b50u)
        throw format_error(path_ + ": zip says ZIP64 but has no ZIP64 end of central directory locator");
      uint64_t z = le(eocd - 20 + 8, 8);
      need(z, 56, "ZIP64 end of central directory");
      if (le(z, 4) != 0x06064b50u)
        throw format_error(path_ + ": no ZIP64 end of central directory record at offset " + std::to_string(z));
      disk = le(z + 16, 4);
      cd_disk = le(z + 20, 4);
      count = le(z + 32, 8);
      cd_size = le(z + 40, 8);
      cd_off = le(z + 48, 8);
    }
    if (disk != 0 || cd_disk != 0) throw format_error(path_ + ": multi-disk zip archives are not supported");
    need(cd_off, cd_size, "central directory");
    if (count > cd_size / 46)
      throw format_error(path_ + ": zip central directory of " + std::to_string(cd_size) + " bytes cannot hold " +
                         std::to_string(count) + " entries");
    entries_.reserve(size_t(count));
    uint64_t p = cd_off;
    const uint64_t end = cd_off + cd_size;
    for (uint64_t i = 0; i < count; ++i) {
      if (p + 46 > end) throw format_error(path_ + ": zip central directory entry " + std::to_string(i) + " is truncated");
      if (le(p, 4) != 0x02014b50u)
        throw format_error(path_ + ": bad zip central directory signature at offset " + std::to_string(p));
      ZipEntry e;
      e.flags = uint16_t(le(p + 8, 2));
      e.method = uint16_t(le(p + 10, 2));
      e.crc = uint32_t(le(p + 16, 4));
      e.csize = le(p + 20, 4);
      e.size = le(p + 24, 4);
      uint64_t nlen = le(p + 28, 2), xlen = le(p + 30, 2), clen = le(p + 32, 2);
      e.header_offset = le(p + 42, 4);
      if (p + 46 + nlen + xlen + clen > end)
        throw format_error(path_ + ": zip central directory entry " + std::to_string(i) + " runs past the directory");
      e.name.assign(reinterpret_cast<const char*>(base_ + p + 46), size_t(nlen));
      // ZIP64 extended information: the 0xffffffff fields, in order size, csize, offset.
      for (uint64_t x = p + 46 + nlen, xend = x + xlen; x + 4 <= xend;) {
        uint64_t id = le(x, 2), len = le(x + 2, 2);
        if (x + 4 + len > xend) throw format_error(path_ + ": zip entry '" + e.name + "' has a truncated extra field");
        if (id == 0x0001) {
          uint64_t q = x + 4, qend = q + len;
          auto take = [&](uint64_t& field) {
            if (field != 0xffffffffu) return;
            if (q + 8 > qend) throw format_error(path_ + ": zip entry '" + e.name + "' has a short ZIP64 extra field");
            field = le(q, 8);
            q += 8;
          };
          take(e.size);
          take(e.csize);
          take(e.header_offset);
        }
        x += 4 + len;
      }
      // The local header repeats the name and has its own extra field (torch pads with it to align the data).
      need(e.header_offset, 30, "local file header");
      if (le(e.header_offset, 4) != 0x04034b50u)
        throw format_error(path_ + ": zip entry '" + e.name + "' has no local file header at offset " +
                           std::to_string(e.header_offset));
      uint64_t lnlen = le(e.header_offset + 26, 2), lxlen = le(e.header_offset + 28, 2);
      e.data_offset = e.header_offset + 30 + lnlen + lxlen;
      need(e.data_offset, e.csize, ("data of zip entry '" + e.name + "'").c_str());
      if (e.method == 0 && e.csize != e.size)
        throw format_error(path_ + ": stored zip entry '" + e.name + "' has size " + std::to_string(e.size) +
                           " but compressed size " + std::to_string(e.csize));
      if (!index_.emplace(e.name, entries_.size()).second)
        throw format_error(path_ + ": zip entry '" + e.name + "' appears twice");
      entries_.push_back(std::move(e));
      p += 46 + nlen + xlen + clen;
    }
  }

  const std::byte* base_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace detail
OPT_NAMESPACE_END
