// One model across MPI ranks (README "One model across machines"): `mpirun -np N opt-generate ...` with the flags of
// one process prints exactly what one process prints (--jsonl --logits byte for byte; -p text; sampling; speculative
// decoding), and matches the Hugging Face goldens (failures.test.mjs: the failures).
// Run by ctest (tests/CMakeLists.txt, only with -DOPT_MPI=ON) with OPT_GENERATE = the MPI build's opt-generate and
// OPT_MPIEXEC = mpirun, on loopback with --oversubscribe (the ranks share this machine's cores; 1 thread each).
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIX, TOKDIR, MODELS, goldens, f32, jsonl, lines, generate } from "./lib.mjs";

test("--jsonl --logits on 2 and 3 ranks: byte for byte one process's output, and the goldens", () => {
  for (const model of MODELS) {
    const m = path.join(FIX, model), g = goldens(model), c = g.cases.find((k) => k.name === "batch_left");
    const rows = c.input_ids.map((ids, b) => ids.filter((_, t) => c.attention_mask[b][t] === 1));
    const args = ["-m", m, "-n", String(c.generate.max_new_tokens), "--jsonl", "-", "--logits"];
    const input = jsonl(rows.map((ids) => ({ ids })));
    const one = generate(1, args, input).stdout;
    // the goldens: each row's new tokens alone, and the logits that chose the first one
    const [B, V] = c.logits_last ? c.logits_last.shape : [c.logits.shape[0], c.logits.shape[2]];
    const T = c.logits_last ? 1 : c.logits.shape[1];
    const want = f32(model, c.logits_last ?? c.logits);
    lines(one).forEach((o, b) => {
      assert.deepEqual(o.new_ids, c.generate.alone[b].new_tokens, `${model} row ${b}: new_ids`);
      const row = want.subarray(((b + 1) * T - 1) * V, (b + 1) * T * V);  // the last (real, left-padded) position
      let d = 0;
      for (let i = 0; i < V; i++) d = Math.max(d, Math.abs(o.logits[i] - row[i]));
      assert.ok(d <= 1e-4, `${model} row ${b}: max |logits - golden| = ${d}`);
    });
    for (const np of model === "opt-tiny-odd" || model === "opt-tiny-realvocab" || model === "opt-tiny-nofinalln-silu"
           ? [2, 3] : [2]) {
      const r = generate(np, args, input);
      assert.equal(r.stdout, one, `${model} on ${np} ranks: not one process's output`);
      assert.equal(B, lines(r.stdout).length);
    }
  }
});

test("-p text, seeded sampling and speculative decoding on 3 ranks: one process's output", () => {
  const m = path.join(FIX, "opt-tiny-realvocab");
  const sample = ["--temp", "0.8", "--top-k", "20", "--seed", "7"], lookup = ["--lookup", "2", "--draft-tokens", "3"];
  for (const extra of [[], sample, lookup]) {
    const args = ["-m", m, "-t", TOKDIR, "-p", "Hello, my dog is cute", "-p", "The capital of France", "-n", "12",
                  ...extra];
    const one = generate(1, args).stdout;
    assert.ok(one.includes("Hello, my dog is cute"));
    assert.equal(generate(3, args).stdout, one, `${extra.join(" ")}: not one process's output`);
  }
});

test("--stats and --peak-rss: the bytes each boundary carried, every rank's peak RSS and part", () => {
  const m = path.join(FIX, "opt-tiny-odd"), H = goldens("opt-tiny-odd").config.hidden_size;
  const r = generate(3, ["-m", m, "-n", "4", "--jsonl", "-", "--stats", "--peak-rss"], jsonl([{ ids: [2, 10, 11] }]));
  // 1 sequence: a prefill pass of 3 tokens (the first new one), then 3 decode passes of 1 token
  const t = r.stderr.match(new RegExp(
      "pipeline: 3 ranks \\(rank 0: layers \\[0, 1\\) of 3, the embeddings, the head\\) \\| 4 passes, (\\d+) tokens " +
      "\\| (\\d+) bytes sent over 3 boundaries \\((\\d+) hidden, (\\d+) headers\\)"));
  assert.ok(t, r.stderr);
  assert.equal(Number(t[1]), 6);
  assert.equal(Number(t[3]), 3 * 6 * H * 4, "hidden bytes: 3 boundaries x 6 tokens x hidden floats");
  assert.equal(Number(t[4]), 2 * 4 * (2 + 5) * 8, "headers: 2 boundaries x 4 passes x 7 int64");
  for (const [rank, part] of [[0, "layers \\[0, 1\\) of 3, the embeddings, the head"], [1, "layers \\[1, 2\\) of 3"],
                              [2, "layers \\[2, 3\\) of 3"]])
    assert.match(r.stderr, new RegExp(`opt-generate: rank ${rank} of 3 \\(${part}\\): peak RSS [1-9]\\d* kB`));
});

