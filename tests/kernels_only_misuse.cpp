// Must not compile (ctest kernels_only_misuse expects dispatch.hpp's #error): OPT_KERNELS_ONLY_<ISA> in a
// translation unit that does not start with opt/kernels/compiled.hpp would declare that ISA's table and then
// define it as an inline function.
#define OPT_KERNELS_ONLY_AVX2 1
#include <opt/kernels/dispatch.hpp>
