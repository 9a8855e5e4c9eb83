// Micro-batches interleaved across the MPI pipeline (opt/pipeline.hpp, Head::lane; README "One model across
// machines"): pipeline-lanes (bench/pipeline_lanes.cpp) with several groups of sequences in flight on 2 and 3 ranks
// gives every sequence the same new ids and the same logits bits (an FNV-1a hash of every row it was chosen from) as
// one process running all of them in one batch, and those ids are opt-generate's.
// Run by ctest (tests/CMakeLists.txt, only with -DOPT_MPI=ON) with OPT_LANES = pipeline-lanes, OPT_GENERATE = the
// MPI build's opt-generate and OPT_MPIEXEC = mpirun, on loopback with --oversubscribe (1 thread per rank).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { FIX, MPIEXEC, ROOT, jsonl, lines, spawn, generate } from "./lib.mjs";

const LANES = process.env.OPT_LANES;
assert.ok(LANES && existsSync(LANES), `OPT_LANES=${LANES} is not the program`);

function lanes(np, model, groups, batch, { prompt = 6, n = 8 } = {}) {
  const args = ["-m", model, "--groups", String(groups), "--batch", String(batch), "--prompt", String(prompt),
                "--new", String(n), "--threads", "1", "--ids"];
  const r = np === 1 ? spawn(LANES, args)
                     : spawn(MPIEXEC, [...ROOT, "--oversubscribe", "-np", String(np), LANES, ...args]);
  assert.equal(r.status, 0, `${np} ranks, ${args.join(" ")}: exit ${r.status} ${r.signal ?? ""}\n${r.stderr}`);
  const seqs = r.stdout.split("\n").filter((l) => l.startsWith("sequence "));
  assert.equal(seqs.length, groups * batch, r.stdout);
  assert.match(r.stdout, new RegExp(`pipeline-lanes: ${np} ranks, ${groups} groups x ${batch} sequences.* tok/s`));
  return seqs;
}

// the prompts pipeline-lanes makes: </s>, then ids from a fixed formula
function prompts(count, prompt, vocab) {
  return Array.from({ length: count }, (_, s) =>
    [2, ...Array.from({ length: prompt - 1 }, (_, i) => 3 + ((s * 7919 + (i + 1) * 104729) % (vocab - 3)))]);
}

test("groups interleaved on 2 and 3 ranks: one batch's ids and logits bits in one process; opt-generate's ids", () => {
  for (const name of ["opt-tiny-odd", "opt-tiny-nofinalln-silu", "opt-tiny-realvocab", "opt-tiny-postln-proj"]) {
    const m = path.join(FIX, name);
    const vocab = JSON.parse(readFileSync(path.join(m, "config.json"), "utf8")).vocab_size;
    const one = lanes(1, m, 1, 4);
    const gen = lines(generate(1, ["-m", m, "-n", "8", "--jsonl", "-"],
                               jsonl(prompts(4, 6, vocab).map((ids) => ({ ids })))).stdout);
    one.forEach((l, s) => {  // (opt-generate stops at </s>; pipeline-lanes runs on)
      const ids = l.replace(/.* ids /, "").split(" ").map(Number), want = gen[s].new_ids;
      assert.deepEqual(ids.slice(0, want.length), want, `${name} sequence ${s}`);
      if (want.length < ids.length) assert.equal(want.at(-1), 2, `${name} sequence ${s}: opt-generate stopped early`);
    });
    const layers = JSON.parse(readFileSync(path.join(m, "config.json"), "utf8")).num_hidden_layers;
    for (const [np, groups, batch] of [[1, 2, 2], [2, 2, 2], [2, 4, 1], ...(layers >= 3 ? [[3, 2, 2], [3, 3, 1]] : [])])
      if (groups * batch === 4 || groups * batch === 3)
        assert.deepEqual(lanes(np, m, groups, batch), one.slice(0, groups * batch),
                         `${name}: ${np} ranks, ${groups} groups x ${batch}`);
  }
});
