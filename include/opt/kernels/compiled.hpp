// Compiles every instruction set's kernels in this translation unit, for a program whose other translation units
// define OPT_KERNELS_EXTERN and so only declare them. A program of many translation units then compiles the
// kernels (most of the library's compile time) once instead of in each. Include it in exactly one .cpp of the
// program, alone:
//   // opt_kernels.cpp, compiled once; every other .cpp with -DOPT_KERNELS_EXTERN
//   #include <opt/kernels/compiled.hpp>
// A program of one translation unit needs neither: by default every header stays header-only.
// Or split it, one translation unit per instruction set, compiled in parallel (each a few times faster than all of
// them at once): define OPT_KERNELS_ONLY_SCALAR, _AVX2, _AVX512 or _NEON before the include, and give the program
// one such unit for each of those its target architecture has (an ISA left out of the build, or of another
// architecture, compiles to nothing):
//   // opt_kernels_avx2.cpp
//   #define OPT_KERNELS_ONLY_AVX2 1
//   #include <opt/kernels/compiled.hpp>
#pragma once
#if defined(OPT_KERNEL_TABLE_LINKAGE) && !defined(OPT_KERNELS_IMPLEMENTATION)
#error "opt/kernels/compiled.hpp must be the first opt header of its translation unit"
#endif
#define OPT_KERNELS_IMPLEMENTATION 1
#include "opt/kernels/dispatch.hpp"

// (each ISA's table() is an ordinary function here, so it is emitted whatever this translation unit calls)
