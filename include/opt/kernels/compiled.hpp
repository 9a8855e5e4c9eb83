// Compiles every instruction set's kernels in this translation unit, for a program whose other translation units
// define OPT_KERNELS_EXTERN and so only declare them. A program of many translation units then compiles the
// kernels (most of the library's compile time) once instead of in each. Include it in exactly one .cpp of the
// program, alone:
//   // opt_kernels.cpp, compiled once; every other .cpp with -DOPT_KERNELS_EXTERN
//   #include <opt/kernels/compiled.hpp>
// A program of one translation unit needs neither: by default every header stays header-only.
#pragma once
#if defined(OPT_KERNEL_TABLE_LINKAGE) && !defined(OPT_KERNELS_IMPLEMENTATION)
#error "opt/kernels/compiled.hpp must be the first opt header of its translation unit"
#endif
#define OPT_KERNELS_IMPLEMENTATION 1
#include "opt/kernels/dispatch.hpp"

// (each ISA's table() is an ordinary function here, so it is emitted whatever this translation unit calls)
