#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included), in a second
# build tree. Any sanitizer report fails the test that triggered it (-fno-sanitize-recover=all, halt_on_error).
#   tests/sanitize.sh [extra ctest args...]
# Environment: BUILD_DIR (default build-asan), CXX (default g++, the compiler of the main build; clang++-14 works
# too but its -Wunused-private-field currently fails examples/opt_serve/ under -Werror), JOBS (default 2),
# OPT_SHARED_DIR (default ../shared), OPT_SANITIZE_EXCLUDE (ctest -E regex, default below).
# Excluded by default: package_* (they configure and build separate consumer projects without sanitizers, so
# they test packaging, not memory safety, and take minutes) and isa_* (the fixture suite again per ISA; test_isa
# still compares the ISAs compiled here), and test_shapes (the same kernels and model code as the fixture tests at
# the larger shapes' widths: minutes of instrumented arithmetic that no other memory path goes through; not even
# built, OPT_SKIP_TESTS).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD_DIR:-$root/build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1"
# The kernels of the scalar path and of this machine's best ISA only (every instrumented ISA costs minutes of
# compile time in each test program); the per-ISA ctest duplicates (isa_*) are left to the main build.
if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
  flags="$flags -DOPT_DISABLE_AVX2"
else
  flags="$flags -DOPT_DISABLE_AVX512"
fi
# Debug (asserts on) with -g1 for its debug flags: line tables, so a report's stack still names file:line, at two
# thirds of -g's compile time
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="${CXX:-g++}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DOPT_NATIVE=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DOPT_SHARED_DIR="${OPT_SHARED_DIR:-$root/../shared}" -DOPT_HEADER_TESTS=OFF -DOPT_SKIP_TESTS=test_shapes >/dev/null
cmake --build "$build" -j "${JOBS:-2}"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd "$build"
ctest --output-on-failure -j "${JOBS:-2}" --timeout 900 -E "${OPT_SANITIZE_EXCLUDE:-^package_|^isa_|^test_shapes$}" "$@"
