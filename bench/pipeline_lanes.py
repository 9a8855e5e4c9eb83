#!/usr/bin/env python3
"""Micro-batches interleaved across the MPI pipeline (Head::lane): aggregate decode tokens/s of pipeline-lanes for
1, 2 and 3 ranks, one group in flight (no interleaving) and several (README "One model across machines").

usage: bench/pipeline_lanes.py BUILD_DIR [--model opt-1.3b] [--dtype bf16] [--new 16] [--prompt 8] [--reps 1]
                               [--threads 1] [--runs "1:1x1,1:1x2,1:2x1,2:1x1,2:1x2,2:2x1,3:1x1,3:1x3,3:3x1"]

A run "R:GxB" is R ranks, G groups of B sequences each. The checkpoint is bench/pipeline.py's (opt-make-random,
stored packed) under $OPT_BENCH_DIR (default BUILD_DIR/bench-models). The figure is the median over --reps of the
aggregate decode tokens/s pipeline-lanes prints; every run's per-sequence logits hashes are checked against the
first run that had the same number of sequences.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--model", default="opt-1.3b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", default="1:1x1,1:1x2,1:2x1,2:1x1,2:1x2,2:2x1,3:1x1,3:1x3,3:3x1")
    a = ap.parse_args()
    lanes = os.path.join(a.build, "tests", "pipeline-lanes")
    make = os.path.join(a.build, "examples", "opt-make-random")
    root = os.environ.get("OPT_BENCH_DIR", os.path.join(a.build, "bench-models"))
    model = os.path.join(root, f"{a.model}-{a.dtype}-packed")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([make, model, "--model", a.model, "--dtype", a.dtype, "--packed"], check=True)
    mpi = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    print(f"{a.model} {a.dtype} (stored packed), prompt {a.prompt}, {a.new} new tokens, {a.threads} thread(s) per "
          f"rank, median of {a.reps}\n")
    print("| ranks | groups x sequences | decode tok/s (aggregate) | ms per step per group |")
    print("|---|---|---|---|")
    hashes = {}
    for run in a.runs.split(","):
        ranks, gb = run.split(":")
        groups, batch = gb.split("x")
        args = [lanes, "-m", model, "--groups", groups, "--batch", batch, "--prompt", str(a.prompt), "--new",
                str(a.new), "--threads", str(a.threads)]
        rates, out = [], ""
        for _ in range(a.reps):
            cmd = args if ranks == "1" else mpi + ["-np", ranks] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
            m = re.search(r"decode (\d+) tokens in ([\d.]+) ms: ([\d.]+) tok/s aggregate", r.stdout)
            rates.append(float(m.group(3)))
            out = r.stdout
        seqs = [l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("sequence ")]
        ok = hashes.setdefault(len(seqs), seqs) == seqs
        rate = statistics.median(rates)
        step = 1000.0 / (rate / (int(groups) * int(batch)))
        print(f"| {ranks} | {groups} x {batch} | {rate:.2f} | {step:.0f} |{'' if ok else ' NOT the same bits'}",
              flush=True)


if __name__ == "__main__":
    main()
