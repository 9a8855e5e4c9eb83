#!/bin/sh
# opt-serve under mpirun, for the server tests (tests/server/*.test.mjs run it as they run opt-serve): OPT_MPI_RANKS
# ranks (default 2) on loopback, 1 compute thread each. mpirun ends the job at once on SIGTERM, so a SIGTERM or
# SIGINT here becomes SIGUSR1 to mpirun, which passes it to every rank: opt-serve's clean shutdown under mpirun.
# Set by ctest: OPT_MPIEXEC (mpirun), OPT_MPI_SERVE (the MPI build's opt-serve).
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
"$OPT_MPIEXEC" $root --oversubscribe -np "${OPT_MPI_RANKS:-2}" "$OPT_MPI_SERVE" --threads 1 "$@" &
pid=$!
trap 'kill -USR1 $pid' TERM INT
rc=0
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
  rc=$?
done
exit $rc
