// Which ISA's kernels run: chosen once, at the first kernel call (or Model::load), from the CPU's features, or
// forced by the environment variable OPT_ISA=scalar|avx2|avx512|neon (an opt::config_error when the name is
// unknown or this CPU or build lacks it). set_isa() changes it at run time (tests and benchmarks compare ISAs in
// one process); the switch is atomic, and a pass already running finishes on the table it started with.
#pragma once
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/kernels/isa.hpp"
#include "opt/kernels/prelude.hpp"
#include "opt/kernels/table.hpp"

// OPT_KERNELS_EXTERN: this translation unit only declares the ISA tables, and one other of the program compiles
// them (#include <opt/kernels/compiled.hpp>, see there). Without it, as by default, every translation unit that
// runs a kernel compiles them all: the library stays header-only. OPT_KERNELS_ONLY_<ISA> (compiled.hpp): this
// translation unit compiles that ISA's table and declares the others.
#if defined(OPT_KERNELS_ONLY_SCALAR) || defined(OPT_KERNELS_ONLY_AVX2) || defined(OPT_KERNELS_ONLY_AVX512) || \
    defined(OPT_KERNELS_ONLY_NEON)
#define OPT_KERNELS_PART 1
#if !defined(OPT_KERNELS_IMPLEMENTATION)
#error "OPT_KERNELS_ONLY_<ISA> is for a translation unit whose first include is opt/kernels/compiled.hpp"
#endif
#endif
#if (defined(OPT_KERNELS_EXTERN) && !defined(OPT_KERNELS_IMPLEMENTATION)) || defined(OPT_KERNELS_PART)
OPT_NAMESPACE_BEGIN
namespace kernels {
namespace scalar_isa {
const Table& table();
}
#if defined(OPT_HAVE_AVX2_KERNELS)
namespace avx2_isa {
const Table& table();
}
#endif
#if defined(OPT_HAVE_AVX512_KERNELS)
namespace avx512_isa {
const Table& table();
}
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
namespace neon_isa {
const Table& table();
}
#endif
}  // namespace kernels
OPT_NAMESPACE_END
#endif
#if !defined(OPT_KERNELS_EXTERN) || defined(OPT_KERNELS_IMPLEMENTATION)
#if !defined(OPT_KERNELS_PART) || defined(OPT_KERNELS_ONLY_AVX2)
#include "opt/kernels/avx2.hpp"
#endif
#if !defined(OPT_KERNELS_PART) || defined(OPT_KERNELS_ONLY_AVX512)
#include "opt/kernels/avx512.hpp"
#endif
#if !defined(OPT_KERNELS_PART) || defined(OPT_KERNELS_ONLY_NEON)
#include "opt/kernels/neon.hpp"
#endif
#if !defined(OPT_KERNELS_PART) || defined(OPT_KERNELS_ONLY_SCALAR)
#include "opt/kernels/scalar.hpp"
#endif
#endif

OPT_NAMESPACE_BEGIN
namespace kernels {

// Every ISA this CPU runs, slowest first (scalar is always there).
inline std::vector<isa> available_isas() {
  std::vector<isa> v;
  for (isa i : {isa::scalar, isa::avx2, isa::avx512, isa::neon})
    if (cpu_supports(i)) v.push_back(i);
  return v;
}

inline std::string available_isas_string() {
  std::string s;
  for (isa i : available_isas()) s += (s.empty() ? "" : ", ") + std::string(to_string(i));
  return s;
}

// The table of `i`; a config_error when this CPU or build cannot run it.
inline const Table& table_for(isa i) {
  f32_prefetch();  // a bad OPT_PREFETCH_F32 is refused here, not in a kernel on a pool thread
  if (!cpu_supports(i))
    throw config_error(std::string("instruction set '") + to_string(i) + "' is not available on this " +
                       (compiled(i) ? "CPU" : "build (another architecture)") + "; available: " +
                       available_isas_string());
  switch (i) {
#if defined(OPT_HAVE_AVX2_KERNELS)
    case isa::avx2: return avx2_isa::table();
#endif
#if defined(OPT_HAVE_AVX512_KERNELS)
    case isa::avx512: return avx512_isa::table();
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
    case isa::neon: return neon_isa::table();
#endif
    default: return scalar_isa::table();
  }
}

// The ISA OPT_ISA names, or the best one.
inline isa requested_isa() {
  const char* e = std::getenv("OPT_ISA");
  if (!e || !*e) return best_isa();
  const auto i = isa_from_string(e);
  if (!i)
    throw config_error(std::string("OPT_ISA=") + e + ": unknown instruction set (expected scalar, avx2, avx512 or neon)");
  if (!cpu_supports(*i))
    throw config_error(std::string("OPT_ISA=") + e + ": this " + (compiled(*i) ? "CPU" : "build (another architecture)") +
                       " cannot run it; available: " + available_isas_string());
  return *i;
}

namespace detail {
inline std::atomic<const Table*>& active_slot() noexcept {
  static std::atomic<const Table*> slot{nullptr};
  return slot;
}
}  // namespace detail

// The kernels in use (chosen on first call).
inline const Table& active() {
  const Table* t = detail::active_slot().load(std::memory_order_acquire);
  if (t) return *t;
  const Table* chosen = &table_for(requested_isa());
  detail::active_slot().compare_exchange_strong(t, chosen, std::memory_order_acq_rel);
  return *detail::active_slot().load(std::memory_order_acquire);
}
inline isa active_isa() { return active().id; }

// Forces `i` from now on (config_error if unavailable).
inline void set_isa(isa i) { detail::active_slot().store(&table_for(i), std::memory_order_release); }

}  // namespace kernels
OPT_NAMESPACE_END
