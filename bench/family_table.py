#!/usr/bin/env python3
"""Runs bench_generate for each (shape, format) given and prints the README's family table (markdown).

usage: bench/family_table.py BENCH_GENERATE SHAPE:FORMAT[,FORMAT...][:prefill] ...
  e.g. bench/family_table.py build/bench/bench_generate opt-1.3b:f32,bf16:prefill opt-6.7b:bf16,int8 opt-13b:int8

Each run is one bench_generate process (its floors measured in the same run) with OPT_BENCH_REPS (default 3 here)
and --new (OPT_FAMILY_NEW, default 20) new tokens; ':prefill' adds BM_Prefill512. Checkpoints are written by
bench_generate on first use under $OPT_BENCH_DIR. Each run's Google Benchmark JSON is kept in family-<shape>.json
in the current folder.
"""
import json
import os
import subprocess
import sys


def run(bench, shape, formats, prefill):
    names = ["BM_ReadBandwidth", "BM_PeakFlops"]
    for f in formats:
        names += [f"BM_Decode/{f}/2", f"BM_Seed4/{f}/2", f"BM_LoadTTFT/{f}/2", f"BM_LoadCold/{f}",
                  f"BM_PeakRSS/{f}/2"]
        if prefill:
            names.append(f"BM_Prefill512/{f}/2")
    filt = "^(" + "|".join(names) + ")/"
    env = dict(os.environ)
    env.setdefault("OPT_BENCH_REPS", "3")
    cmd = [bench, f"--model={shape}", "--formats=" + ",".join(formats),
           "--new=" + os.environ.get("OPT_FAMILY_NEW", "20"), "--benchmark_filter=" + filt,
           "--benchmark_format=json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    with open(f"family-{shape}.json", "w") as f:
        f.write(out)
    res = {}
    for b in json.loads(out)["benchmarks"]:
        res[b["name"].split("/iterations")[0]] = b
    return res


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bench = sys.argv[1]
    rows = []
    for spec in sys.argv[2:]:
        parts = spec.split(":")
        shape, formats, prefill = parts[0], parts[1].split(","), len(parts) > 2 and parts[2] == "prefill"
        r = run(bench, shape, formats, prefill)
        bw = r["BM_ReadBandwidth/2"]["GBps"]
        peak = r.get("BM_PeakFlops/2", {}).get("GFLOPs", 0)
        for f in formats:
            d, s = r[f"BM_Decode/{f}/2"], r[f"BM_Seed4/{f}/2"]
            warm, cold, rss = r[f"BM_LoadTTFT/{f}/2"], r[f"BM_LoadCold/{f}"], r[f"BM_PeakRSS/{f}/2"]
            p = r.get(f"BM_Prefill512/{f}/2")
            rows.append("| {} | {} | {:.2f} | {:.2f} ({:.2f}x budget) | {:.0f} ms | {:.1f} s | {:.1f} | {:.2f}x | "
                        "{:.2f}x | {} | {:.1f} GB/s{} | {} |".format(
                            shape, f, d["MB_per_token"] / 1e3, rss["peak_rss_MiB"] / 1024, rss["x_budget"],
                            warm["load_ms"], cold["load_ms"] / 1e3, d["ms_per_token"], d["x_floor"],
                            s["x_batch1_step"], "{:.0f} ms ({:.2f}x)".format(p["ms"], p["x_floor"]) if p else "-",
                            bw, ", {:.0f} GFLOP/s".format(peak) if p else "", d["label"]))
    print("| shape | weights | GB read a token | peak RSS GiB | load (warm) | load (cold) | ms/token | x floor | "
          "batch-4 step / batch-1 | prefill 512 | floors | ISA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
