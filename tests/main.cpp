// The doctest main shared by every test program. When OPT_ISA names an instruction set this CPU (or build)
// cannot run, the program exits with 77, which ctest reports as skipped (the per-ISA fixture passes: an
// AVX2-only machine skips avx512, an x86 build never registers neon).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <opt/kernels/dispatch.hpp>

int main(int argc, char** argv) {
  if (const char* e = std::getenv("OPT_ISA"); e && *e) {
    const auto i = opt::kernels::isa_from_string(e);
    if (i && !opt::kernels::cpu_supports(*i)) {
      std::printf("OPT_ISA=%s: not available here (available: %s): skipped\n", e,
                  opt::kernels::available_isas_string().c_str());
      return 77;
    }
  }
  std::printf("kernels: %s\n", opt::kernels::to_string(opt::kernels::active_isa()));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
