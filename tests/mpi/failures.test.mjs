// One model across MPI ranks (README "One model across machines"), when things go wrong: a rank that dies mid-run
// ends the job with an error, not a hang; bad input on rank 0 and ranks holding different models end with one clear
// message and a non-zero exit (outputs.test.mjs: the outputs).
// Run by ctest (tests/CMakeLists.txt, only with -DOPT_MPI=ON) with OPT_GENERATE = the MPI build's opt-generate and
// OPT_MPIEXEC = mpirun, on loopback with --oversubscribe (the ranks share this machine's cores; 1 thread each).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";

const SHARED = process.env.OPT_SHARED_DIR ?? path.resolve(import.meta.dirname, "../../../shared");
const FIX = path.join(SHARED, "fixtures");
const TOKDIR = path.join(SHARED, "tokenizer");
const GENERATE = process.env.OPT_GENERATE, MPIEXEC = process.env.OPT_MPIEXEC ?? "mpirun";
assert.ok(GENERATE && existsSync(GENERATE), `OPT_GENERATE=${GENERATE} is not the program`);
const ROOT = process.getuid && process.getuid() === 0 ? ["--allow-run-as-root"] : [];
const MODELS = JSON.parse(readFileSync(path.join(FIX, "manifest.json"), "utf8")).models.map((m) => m.dir);

const goldens = (model) => JSON.parse(readFileSync(path.join(FIX, model, "goldens.json"), "utf8"));
function f32(model, desc) {
  const b = readFileSync(path.join(FIX, model, desc.file));
  return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
}
const jsonl = (objs) => objs.map((o) => JSON.stringify(o)).join("\n") + "\n";
const lines = (s) => s.trimEnd().split("\n").map((l) => JSON.parse(l));

function spawn(cmd, args, input, timeout = 60000) {
  const t0 = Date.now();
  const r = spawnSync(cmd, args,
                      { input: input ?? "", encoding: "utf8", maxBuffer: 1 << 28, timeout, killSignal: "SIGKILL" });
  assert.equal(r.error, undefined, `${cmd} ${args.join(" ")}: ${r.error} (after ${Date.now() - t0} ms)`);
  return r;
}
// One process, or `np` ranks; `ok` requires exit 0.
function generate(np, args, input, { ok = true } = {}) {
  const mpi = [...ROOT, "--oversubscribe", "-np", String(np), GENERATE, "--threads", "1"];
  const r = np === 1 ? spawn(GENERATE, args, input) : spawn(MPIEXEC, [...mpi, ...args], input);
  if (ok) assert.equal(r.status, 0, `${np} ranks, ${args.join(" ")}: exit ${r.status} ${r.signal ?? ""}\n${r.stderr}`);
  return r;
}

test("a rank that dies mid-run ends the job with an error, not a hang", () => {
  const m = path.join(FIX, "opt-tiny-odd");
  const t0 = Date.now();
  const r = generate(3, ["-m", m, "-n", "30", "--jsonl", "-", "--pipeline-fail-after", "3"],
                     jsonl([{ ids: [2, 10, 11] }]), { ok: false });
  assert.ok(Date.now() - t0 < 30000, "the job took more than 30 s to end");
  assert.notEqual(r.status, 0, "exit 0 after a rank died");
  assert.match(r.stderr, /rank 1: ending abruptly after 3 passes/);
  assert.match(r.stderr, /exited with non-zero status|exited on signal|aborted/i, r.stderr);
  assert.equal(r.stdout, "", "rank 0 printed an answer it could not have computed");
});

test("errors: bad input on rank 0 and ranks holding different models end with one clear message", () => {
  const m = path.join(FIX, "opt-tiny-odd");
  const bad = generate(2, ["-m", m, "-n", "4", "--jsonl", "-"], jsonl([{ ids: [2, 100000] }]), { ok: false });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /opt-generate: rank 0: \[opt\.input\] generate: prompt 0 token 1 = 100000 is outside/);
  // rank 0 and rank 1 given different models (MPMD): the handshake names the rank
  const r = spawn(MPIEXEC, [...ROOT, "--oversubscribe", "-np", "1", GENERATE, "-m", m, "-n", "4", "--jsonl", "-", ":",
                            "-np", "1", GENERATE, "-m", path.join(FIX, "opt-tiny-preln"), "-n", "4", "--jsonl", "-"],
                  jsonl([{ ids: [2, 10] }]));
  assert.notEqual(r.status, 0);
  assert.match(r.stderr,
               /rank 0: \[opt\.config\] pipeline: rank 1 holds a model of 2 layers, hidden 64, 4 heads; rank 0's/);
});
