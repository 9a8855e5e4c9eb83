// Memory for large buffers (packed weights, KV caches, workspaces): 2 MiB-aligned anonymous mappings that the
// kernel is asked to back with transparent huge pages (madvise MADV_HUGEPAGE). Internal.
//
// Why: the kernels stream hundreds of MB of weights per token. With 4 KiB pages that is one TLB miss per 4 KiB
// read, and in a VM (nested paging) each miss walks two page tables. On a 2-vCPU Zen 5 VM whose THP mode is
// "madvise" (Debian's default), a 512-token prefill of the opt-125m shape on 2 threads took 400-830 ms with
// 4 KiB pages and 315-480 ms with huge pages, in interleaved runs. Where THP is off ("never") or the call fails
// the memory is ordinary pages: only speed differs, never a result.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
// Buffers from this size on go to huge-page mappings; smaller ones to operator new (a mapping each would waste
// most of a 2 MiB page and a system call).
constexpr std::size_t kLargeAllocation = std::size_t(4) << 20;

inline std::size_t huge_round(std::size_t bytes) noexcept { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// `bytes` of memory aligned to at least `align` (<= 2 MiB), zeroed when it is a mapping (bytes >=
// kLargeAllocation on Linux); std::bad_alloc when there is none. huge = false: the mapping gets no huge-page
// hint (LazyAllocator below: a KV cache made with huge_pages = false).
inline void* large_alloc(std::size_t bytes, std::size_t align, bool huge = true) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kLargeAllocation) {
    const std::size_t len = huge_round(bytes);
    void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    // keep the 2 MiB-aligned [p, p + len) of the mapping, return the rest (the tail is never empty: p < b + 2 MiB)
    const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t p = huge_round(b);
    if (p > b) ::munmap(raw, p - b);
    ::munmap(reinterpret_cast<void*>(p + len), b + kHugePage - p);
    // a hint (ignored where THP is off), except for the last 2 MiB when the buffer ends inside it: a huge page
    // there would back the whole tail past `bytes` too (at opt-2.7b in bf16, 128 matrices of 6.25 x 2 MiB each
    // held ~200 MB of such tails, and peak RSS went 3% over file + KV cache + 64 MiB); 4 KiB pages back only what
    // is touched
    if (huge) ::madvise(reinterpret_cast<void*>(p), bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // >= 2 MiB
    return reinterpret_cast<void*>(p);
  }
#endif
  return ::operator new(bytes, std::align_val_t(align));
}

// Frees what large_alloc(bytes, align) returned.
inline void large_free(void* p, std::size_t bytes, std::size_t align) noexcept {
  if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kLargeAllocation) {
    ::munmap(p, huge_round(bytes));
    return;
  }
#endif
  ::operator delete(p, std::align_val_t(align));
}

// A std::vector allocator for buffers that are filled as they are used (a KV cache: position t is written before
// it is read): large_alloc memory, elements default-initialized (resize() writes nothing, so a page is committed
// when it is first written), with or without the huge-page hint (`huge`, kept by copies of the vector).
// The hint's trade, measured on a 2-vCPU Intel VM (THP and its defrag "madvise"): 100 MB of fresh memory took 680
// ms to touch with the hint and 35-47 ms without, but reading 140 MB of keys and values (an opt-125m decode at
// 1900 positions) took 3.5 ms from huge pages and 4.3-4.9 ms from 4 KiB ones.
template <class T>
struct LazyAllocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;
  bool huge = true;
  LazyAllocator() = default;
  explicit LazyAllocator(bool huge_pages) noexcept : huge(huge_pages) {}
  template <class U>
  LazyAllocator(const LazyAllocator<U>& o) noexcept : huge(o.huge) {}
  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(large_alloc(n * sizeof(T), 64, huge));
  }
  void deallocate(T* p, std::size_t n) noexcept { large_free(p, n * sizeof(T), 64); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialized: nothing written
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(static_cast<A&&>(a)...);
  }
  template <class U>
  bool operator==(const LazyAllocator<U>& o) const noexcept { return huge == o.huge; }
  template <class U>
  bool operator!=(const LazyAllocator<U>& o) const noexcept { return huge != o.huge; }
};

// One buffer of large_alloc memory, zeroed, 64-byte aligned (huge pages from kLargeAllocation up), freed with it.
class LargeBuffer {
 public:
  explicit LargeBuffer(std::size_t bytes) : n_(bytes) {
    if (n_ == 0) return;
    p_ = static_cast<std::byte*>(large_alloc(n_, 64));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n_ < kLargeAllocation)  // (a fresh anonymous mapping is already zero)
#endif
      std::memset(p_, 0, n_);
  }
  LargeBuffer(const LargeBuffer&) = delete;
  LargeBuffer& operator=(const LargeBuffer&) = delete;
  ~LargeBuffer() { large_free(p_, n_, 64); }
  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace detail
OPT_NAMESPACE_END
