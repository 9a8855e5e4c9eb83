// One model across MPI ranks (README "One model across machines"), when things go wrong: a rank that dies mid-run
// ends the job with an error, not a hang; bad input on rank 0 and ranks holding different models end with one clear
// message and a non-zero exit (outputs.test.mjs: the outputs).
// Run by ctest (tests/CMakeLists.txt, only with -DOPT_MPI=ON) with OPT_GENERATE = the MPI build's opt-generate and
// OPT_MPIEXEC = mpirun, on loopback with --oversubscribe (the ranks share this machine's cores; 1 thread each).
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIX, GENERATE, MPIEXEC, ROOT, jsonl, spawn, generate } from "./lib.mjs";

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
