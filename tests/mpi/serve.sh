#!/bin/sh
# opt-serve under mpirun, for the server tests (tests/server/*.test.mjs run it as they run opt-serve): the ranks
# OPT_MPI_RANKS (default 2) on loopback, 1 compute thread each; SIGTERM reaches mpirun, which passes it to every rank.
# Set by ctest: OPT_MPIEXEC (mpirun), OPT_MPI_SERVE (the MPI build's opt-serve).
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
exec "$OPT_MPIEXEC" $root --oversubscribe -np "${OPT_MPI_RANKS:-2}" "$OPT_MPI_SERVE" --threads 1 "$@"
