// Shared helpers of the opt-serve tests: start a server on a free loopback port, stop it, talk to it.
// Run by ctest (tests/CMakeLists.txt) with OPT_SERVE = the opt-serve program and OPT_SHARED_DIR = ../shared.
// Every request goes to 127.0.0.1; every loop is bounded in count and time.
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";

export const SERVE = process.env.OPT_SERVE ?? "";
export const SHARED = process.env.OPT_SHARED_DIR ?? path.resolve(import.meta.dirname ?? ".", "../../../shared");
export const MODEL = path.join(SHARED, "fixtures", "opt-tiny-realvocab");
export const TOKENIZER = path.join(SHARED, "tokenizer");
export const OUT = process.env.OPT_TEST_OUT ?? "/tmp";
export const CI = !!process.env.CI;

// The realvocab goldens: prompts (texts) and what Hugging Face generated for them alone (greedy, 8 tokens).
export function goldens() {
  const g = JSON.parse(readFileSync(path.join(MODEL, "goldens.json"), "utf8"));
  const alone = new Map();  // prompt text -> {decoded, decoded_new, new_tokens}
  for (const c of g.cases) {
    const gen = c.generate;
    const rows = gen.alone ?? gen.decoded.map((d, i) => ({ decoded: d, decoded_new: gen.decoded_new[i],
                                                           new_tokens: gen.new_tokens[i] }));
    c.texts.forEach((t, i) =>
      alone.set(t, { ...rows[i], prompt_ids: c.prompts[i], max_new_tokens: gen.max_new_tokens }));
  }
  return alone;
}

export function requireServe() {
  assert.ok(SERVE && existsSync(SERVE), `OPT_SERVE=${SERVE} is not the opt-serve program`);
  assert.ok(existsSync(path.join(MODEL, "config.json")), `no fixture model at ${MODEL}`);
}

// Flags every server of a test run gets (OPT_SERVE_ARGS, space-separated): ctest runs some test files again with
// speculative decoding on (tests/CMakeLists.txt).
export const EXTRA_ARGS = (process.env.OPT_SERVE_ARGS ?? "").split(" ").filter((a) => a !== "");

// Starts opt-serve on 127.0.0.1 with --port `port` (0: a free one) and reads the port it prints. The benchmarks
// (bench/lib.mjs) pass their own `serve` program, `wrapper` (a command prefix: ["nice", "-n", "19"]; the process
// execs, so proc.pid is opt-serve's), `startMs`, `extraArgs` (default OPT_SERVE_ARGS) and `echoStderr` (copy the
// server's stderr to ours as well).
export async function startServer(args = [], { model = MODEL, tokenizer = TOKENIZER, port: want = 0, serve = null,
                                               wrapper = [], startMs = 30000, extraArgs = EXTRA_ARGS,
                                               echoStderr = false } = {}) {
  if (serve === null) requireServe();
  else assert.ok(existsSync(serve), `${serve} not found: build the opt-serve target (or pass --build)`);
  const cmd = [...wrapper, serve ?? SERVE, "-m", model, "-t", tokenizer, "--host", "127.0.0.1", "--port", String(want),
               ...extraArgs, ...args];
  const proc = spawn(cmd[0], cmd.slice(1), { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; if (echoStderr) process.stderr.write(d); });
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`opt-serve did not start in ${startMs / 1000} s:\n` + stderr)),
                             startMs);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`opt-serve exited (${code ?? signal}) before listening:\n${stderr}`));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  return {
    url, port, proc, exited,
    stderr: () => stderr,
    // SIGTERM, then the exit status within `ms` (SIGKILL and a failure past that)
    async stop(ms = 10000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return exited;
      proc.kill("SIGTERM");
      let timer;
      const r = await Promise.race([exited, new Promise((res) => { timer = setTimeout(() => res(null), ms); })]);
      clearTimeout(timer);
      if (r === null) {
        proc.kill("SIGKILL");
        throw new Error(`opt-serve did not stop within ${ms} ms of SIGTERM:\n${stderr}`);
      }
      return r;
    },
  };
}

export async function postJson(url, body, opts = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(opts.timeoutMs ?? 60000),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

export async function getJson(url) {
  const res = await fetch(url, { signal: AbortSignal.timeout(20000) });
  return { status: res.status, json: await res.json() };
}

// Parses a server-sent event stream body into its data payloads (strings).
export function sseData(text) {
  const out = [];
  for (const event of text.split("\n\n"))
    for (const line of event.split("\n"))
      if (line.startsWith("data: ")) out.push(line.slice(6));
  return out;
}

// A streamed completion read to its end: {text, finish_reason, chunks, usage, done}.
export async function streamCompletion(url, body, opts = {}) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
    signal: AbortSignal.timeout(opts.timeoutMs ?? 60000),
  });
  assert.equal(res.status, 200, `stream status ${res.status}: ${res.status !== 200 ? await res.text() : ""}`);
  assert.match(res.headers.get("content-type") ?? "", /text\/event-stream/);
  const data = sseData(await res.text());
  const r = { text: "", finish_reason: null, chunks: 0, usage: null, done: false };
  for (const d of data) {
    if (d === "[DONE]") { r.done = true; continue; }
    assert.equal(r.done, false, "data after [DONE]");
    const c = JSON.parse(d);
    assert.equal(c.error, undefined, `error event: ${d}`);
    if (c.usage) r.usage = c.usage;
    for (const ch of c.choices) {
      r.text += ch.text;
      r.chunks++;
      if (ch.finish_reason) r.finish_reason = ch.finish_reason;
    }
  }
  return r;
}

export function assertApiError(r, status, param) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.ok(r.json && r.json.error, `no JSON error body: ${r.text}`);
  assert.equal(typeof r.json.error.message, "string");
  assert.ok(r.json.error.message.length > 0);
  assert.equal(typeof r.json.error.type, "string");
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `f` until it returns a truthy value; fails after `ms`.
export async function until(f, ms, what) {
  const t0 = Date.now();
  for (let i = 0; Date.now() - t0 < ms && i < 10000; i++) {
    const v = await f();
    if (v) return v;
    await sleep(20);
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}`);
}

// 40 different prompts of different lengths, for the concurrency tests.
export function manyPrompts(n = 40) {
  const subjects = ["The cat", "A small robot", "My grandmother", "The old lighthouse", "Every programmer",
                    "The river", "Our neighbour's dog", "A quiet library", "The first astronaut", "This recipe"];
  const verbs = ["likes to", "never wanted to", "was about to", "decided to", "could not"];
  const ends = ["", " on Sunday", " in the morning, when the town was still asleep", " again", " with great care"];
  const out = [];
  for (let i = 0; i < n; i++)
    out.push(`${subjects[i % 10]} ${verbs[Math.floor(i / 10) % 5]} sing${ends[i % 5]} (${i})`);
  return out;
}
