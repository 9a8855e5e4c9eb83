// What the MPI tests (outputs.test.mjs, failures.test.mjs) share: the fixtures, and running opt-generate as one
// process or as `mpirun -np N` ranks on loopback (--oversubscribe, 1 thread each).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";

export const SHARED = process.env.OPT_SHARED_DIR ?? path.resolve(import.meta.dirname, "../../../shared");
export const FIX = path.join(SHARED, "fixtures");
export const TOKDIR = path.join(SHARED, "tokenizer");
export const GENERATE = process.env.OPT_GENERATE, MPIEXEC = process.env.OPT_MPIEXEC ?? "mpirun";
assert.ok(GENERATE && existsSync(GENERATE), `OPT_GENERATE=${GENERATE} is not the program`);
export const ROOT = process.getuid && process.getuid() === 0 ? ["--allow-run-as-root"] : [];
export const MODELS = JSON.parse(readFileSync(path.join(FIX, "manifest.json"), "utf8")).models.map((m) => m.dir);

export const goldens = (model) => JSON.parse(readFileSync(path.join(FIX, model, "goldens.json"), "utf8"));
export function f32(model, desc) {
  const b = readFileSync(path.join(FIX, model, desc.file));
  return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
}
export const jsonl = (objs) => objs.map((o) => JSON.stringify(o)).join("\n") + "\n";
export const lines = (s) => s.trimEnd().split("\n").map((l) => JSON.parse(l));

export function spawn(cmd, args, input, timeout = 60000) {
  const t0 = Date.now();
  const r = spawnSync(cmd, args,
                      { input: input ?? "", encoding: "utf8", maxBuffer: 1 << 28, timeout, killSignal: "SIGKILL" });
  assert.equal(r.error, undefined, `${cmd} ${args.join(" ")}: ${r.error} (after ${Date.now() - t0} ms)`);
  return r;
}
// One process, or `np` ranks; `ok` requires exit 0.
export function generate(np, args, input, { ok = true } = {}) {
  const mpi = [...ROOT, "--oversubscribe", "-np", String(np), GENERATE, "--threads", "1"];
  const r = np === 1 ? spawn(GENERATE, args, input) : spawn(MPIEXEC, [...mpi, ...args], input);
  if (ok) assert.equal(r.status, 0, `${np} ranks, ${args.join(" ")}: exit ${r.status} ${r.signal ?? ""}\n${r.stderr}`);
  return r;
}
