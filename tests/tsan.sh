#!/usr/bin/env bash
# ThreadSanitizer over what runs on more than one thread: opt-serve (HTTP I/O threads, the scheduler, the compute
# pool) under the whole server test suite (tests/server, driven by ctest), and the C++ tests of Batch, the prefix
# cache and the thread pool; in a second build tree. Not in CI (.ci/run): see the README for its runtime.
#   tests/tsan.sh [extra ctest args...]
# Environment: BUILD_DIR (default build-tsan), CXX (default g++), JOBS (default 1: compile jobs; the tests run one
# at a time), OPT_SHARED_DIR (default ../shared), OPT_TSAN_TESTS (ctest -R regex, default below).
# Every process writes its reports to BUILD_DIR/tsan-logs/ (log_path: opt-serve is a child of Node, whose tests
# do not all look at its exit status); the script fails when a test fails or any report was written.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD_DIR:-$root/build-tsan}
# The kernels of the scalar path and of this machine's best ISA only (as tests/sanitize.sh). -Wno-tsan: GCC 12
# reports Boost.Asio's std::atomic_thread_fence (std_fenced_block), which TSan does not model, as an error under
# -Werror; Asio's handoffs between threads also go through its mutexes, which TSan does see.
flags="-fsanitize=thread -g -O1 -Wno-tsan"
if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
  flags="$flags -DOPT_DISABLE_AVX2"
else
  flags="$flags -DOPT_DISABLE_AVX512"
fi
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="${CXX:-g++}" -DCMAKE_BUILD_TYPE=Debug -DOPT_NATIVE=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DOPT_SHARED_DIR="${OPT_SHARED_DIR:-$root/../shared}" -DOPT_HEADER_TESTS=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-1}" --target opt-serve test_batch test_prefix_cache test_thread_pool test_threads
[ -d "$root/tests/server/node_modules" ] || npm ci --prefix "$root/tests/server"
logs=$build/tsan-logs
rm -rf "$logs" && mkdir -p "$logs"
export TSAN_OPTIONS="log_path=$logs/tsan second_deadlock_stack=1 history_size=4"
cd "$build"
status=0
ctest --output-on-failure -j 1 --timeout 1200 \
  -R "${OPT_TSAN_TESTS:-^(test_batch|test_prefix_cache|test_thread_pool|test_threads|server_.*)$}" "$@" || status=1
if compgen -G "$logs/tsan*" >/dev/null; then
  echo "tsan.sh: ThreadSanitizer reports in $logs:" >&2
  grep -h "^WARNING: ThreadSanitizer\|^SUMMARY" "$logs"/tsan* | sort | uniq -c >&2
  status=1
fi
exit $status
