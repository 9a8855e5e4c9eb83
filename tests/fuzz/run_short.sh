#!/usr/bin/env bash
# Builds the fuzz targets (clang++-14, libFuzzer + ASan + UBSan), seeds their corpora from ../shared and runs each
# for a short time, after replaying the inputs it once crashed on (tests/fuzz/regressions/TARGET/); exits non-zero
# on a crash, leak, hang, sanitizer report or oversized allocation.
#   tests/fuzz/run_short.sh [SECONDS_PER_TARGET [TARGET...]]      (default 25 s, every fuzz_*.cpp)
# Environment: BUILD_DIR (default build-fuzz), CXX (default clang++-14), OPT_SHARED_DIR (default ../shared),
# JOBS (build parallelism, default 2). Crash inputs land in $BUILD_DIR/artifacts/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
secs=${1:-25}
shift || true
build=${BUILD_DIR:-$root/build-fuzz}
shared=${OPT_SHARED_DIR:-$root/../shared}
if [ $# -gt 0 ]; then targets=("$@"); else
  targets=(); for f in "$here"/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done
fi
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="${CXX:-clang++-14}" -DOPT_FUZZ=ON -DOPT_BUILD_TESTS=OFF \
  -DOPT_BUILD_EXAMPLES=OFF -DOPT_INSTALL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPT_SHARED_DIR="$shared" >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]/#/fuzz_}"
OPT_FUZZ_SHARED_DIR="$shared" "$here/make_corpus.sh" "$build/corpus" "$shared"
mkdir -p "$build/artifacts" "$build/logs"
status=0
for t in "${targets[@]}"; do
  log="$build/logs/$t.log"
  # -malloc_limit_mb: one allocation of more than 1 GB is a finding (inputs are at most a few hundred KB).
  dict=(); [ -f "$here/$t.dict" ] && dict=(-dict="$here/$t.dict")  # a target's dictionary, when it has one
  # every input this target ever crashed on (tests/fuzz/regressions/TARGET/) runs first, once each
  if [ -d "$here/regressions/$t" ] && ! OPT_FUZZ_SHARED_DIR="$shared" "$build/tests/fuzz/fuzz_$t" \
       "$here/regressions/$t"/* >"$build/logs/$t.regressions.log" 2>&1; then
    echo "fuzz_$t: a regression input fails again (see $build/logs/$t.regressions.log)"; status=1; continue
  fi
  if OPT_FUZZ_SHARED_DIR="$shared" "$build/tests/fuzz/fuzz_$t" "$build/corpus/$t" "${dict[@]}" -max_total_time="$secs" \
       -timeout=25 -rss_limit_mb=2560 -malloc_limit_mb=1024 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$t-" >"$log" 2>&1; then
    echo "fuzz_$t: ok, $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions in ${secs} s"
  else
    echo "fuzz_$t: FAILED (see $log)"; grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -5
    status=1
  fi
done
exit $status
