#!/usr/bin/env bash
# One model across MPI ranks (README "One model across machines"), in CI: Debian's OpenMPI, a second build tree with
# -DOPT_MPI=ON holding only what the MPI tests run (opt-generate, opt-serve, pipeline-lanes), then `ctest -L mpi`:
# tests/mpi/*.test.mjs (outputs, failures, lanes) and the server's generate tests against opt-serve on 2 and 3 ranks,
# all on loopback with --oversubscribe (as root, with --allow-run-as-root). Needs what the README's test command
# installed (the compiler, the libraries, node and tests/server's npm packages).
#   tests/mpi.sh [extra ctest args...]
# Environment: BUILD_DIR (default build-mpi), JOBS (default 2), OPT_SHARED_DIR (default ../shared),
# OPT_MPI_INSTALL=0 to skip the apt-get install.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD_DIR:-$root/build-mpi}
if [ "${OPT_MPI_INSTALL:-1}" != 0 ]; then
  apt-get install -y libopenmpi-dev openmpi-bin
fi
if [ "$(id -u)" = 0 ]; then  # the tests pass --allow-run-as-root; these cover any mpirun they do not start
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cmake -S "$root" -B "$build" -DOPT_MPI=ON -DOPT_HEADER_TESTS=OFF -DOPT_INSTALL=OFF \
  -DOPT_SHARED_DIR="${OPT_SHARED_DIR:-$root/../shared}" >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target opt-generate opt-serve pipeline-lanes
cd "$build"
ctest --output-on-failure -j "${JOBS:-2}" -L mpi "$@"
