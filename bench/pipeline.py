#!/usr/bin/env python3
"""One model over 1, 2 and 3 MPI ranks on this machine: decode ms/token, the bytes the hand-offs moved, each rank's
peak RSS (README "One model across machines"). Needs the -DOPT_MPI=ON build's opt-generate and opt-make-random.

usage: bench/pipeline.py BUILD_DIR [--model opt-1.3b] [--dtype bf16] [--new 32] [--reps 3] [--ranks 1,2,3]
                         [--threads 1]

The checkpoint is random weights of the published shape, written once by opt-make-random (stored packed, so a
rank maps its panels and touches only its own layers) under $OPT_BENCH_DIR (default BUILD_DIR/bench-models).
Each run is `mpirun --oversubscribe -np N opt-generate -p PROMPT -n NEW --threads T --stats --peak-rss` (1 rank:
the plain process); the figure is the median over --reps of the decode ms/token opt-generate prints. All ranks
share this machine's cores, so the default is 1 thread per rank: on 2 cores, 3 ranks take turns on them, and only
one of them computes at a time anyway (a pipeline of one sequence is sequential).
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
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.environ.get("OPT_SHARED_DIR", os.path.join(here, "..", "..", "shared"))
    gen = os.path.join(a.build, "examples", "opt-generate")
    make = os.path.join(a.build, "examples", "opt-make-random")
    root = os.environ.get("OPT_BENCH_DIR", os.path.join(a.build, "bench-models"))
    model = os.path.join(root, f"{a.model}-{a.dtype}-packed")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([make, model, "--model", a.model, "--dtype", a.dtype, "--packed"], check=True)
    mpi = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    args = [gen, "-m", model, "-t", os.path.join(shared, "tokenizer"), "-p", "Hello, my name is", "-n", str(a.new),
            "--threads", str(a.threads), "--stats", "--peak-rss", "--no-stream"]
    print(f"{a.model} {a.dtype} (stored packed), {a.new} new tokens, {a.threads} thread(s) per rank, median of "
          f"{a.reps}\n")
    print("| ranks | decode ms/token | prefill ms | bytes per pass per boundary | peak RSS per rank (MiB) |")
    print("|---|---|---|---|---|")
    texts = {}
    for np_ in [int(x) for x in a.ranks.split(",")]:
        decode, prefill, per_pass, rss = [], [], "-", {}
        for _ in range(a.reps):
            cmd = args if np_ == 1 else mpi + ["-np", str(np_)] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
            texts.setdefault(r.stdout, []).append(np_)
            m = re.search(r"prefill \d+ tokens in ([\d.]+) ms .* decode \d+ tokens in [\d.]+ ms \([\d.]+ tok/s, "
                          r"([\d.]+) ms/token\)", r.stderr)
            prefill.append(float(m.group(1)))
            decode.append(float(m.group(2)))
            m = re.search(r"\| ([\d.]+) bytes per pass per boundary", r.stderr)
            if m:
                per_pass = m.group(1)
            for rank, kb in re.findall(r"opt-generate: rank (\d+) of \d+ .*: peak RSS (\d+) kB", r.stderr):
                rss[int(rank)] = max(rss.get(int(rank), 0), int(kb))
            m = re.search(r"^opt-generate: peak RSS (\d+) kB", r.stderr, re.M)
            if m:
                rss[0] = max(rss.get(0, 0), int(m.group(1)))
        rss_s = " / ".join(f"{rss[k] / 1024:.0f}" for k in sorted(rss))
        print(f"| {np_} | {statistics.median(decode):.1f} | {statistics.median(prefill):.1f} | {per_pass} | {rss_s} |",
              flush=True)
    print(f"\nthe same text from every run: {'yes' if len(texts) == 1 else 'NO: ' + str(list(texts.values()))}")


if __name__ == "__main__":
    main()
