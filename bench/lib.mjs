// What the opt-serve benchmarks (bench_serve.mjs, bench_replicas.mjs, soak.mjs) share: the command line's common
// flags, the programs of a build, the random opt-125m checkpoint, the prompts, starting a server (tests/server's
// startServer) and one streamed completion. Only 127.0.0.1 is contacted.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { startServer } from "../tests/server/lib.mjs";

export const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");

// The command line: --build, --model and --tokenizer (every script's) and `options` (the script's own, parseArgs
// style). `model`: the default of --model (undefined: the random checkpoint, see randomModel).
export function benchArgs(options, { model } = {}) {
  const { values } = parseArgs({
    options: {
      build: { type: "string", default: path.join(root, "build") },
      model: { type: "string", ...(model !== undefined ? { default: model } : {}) },
      tokenizer: { type: "string", default: path.resolve(root, "../shared/tokenizer") },
      ...options,
    },
  });
  return values;
}

// The programs of the build folder; opt-serve must be built.
export function programs(build) {
  const serve = path.join(build, "examples", "opt-serve");
  if (!existsSync(serve)) throw new Error(`${serve} not found: build the opt-serve target (or pass --build)`);
  return { serve, makeRandom: path.join(build, "examples", "opt-make-random") };
}

// --model, or the random checkpoint of the opt-125m shape (OPT_BENCH_DIR or BUILD/bench-models, opt-125m-f32),
// written once with opt-make-random; `who` names the script in its message.
export function randomModel(a, who, { dtype = "f32" } = {}) {
  const makeRandom = path.join(a.build, "examples", "opt-make-random");
  const dir = a.model ??
              path.join(process.env.OPT_BENCH_DIR ?? path.join(a.build, "bench-models"), `opt-125m-${dtype}`);
  if (!existsSync(path.join(dir, "config.json"))) {
    if (!existsSync(makeRandom)) throw new Error(`${dir} has no checkpoint and ${makeRandom} is not built`);
    console.error(`${who}: writing a random opt-125m checkpoint to ${dir}`);
    execFileSync(makeRandom, [dir, "--model", "opt-125m", ...(dtype !== "f32" ? ["--dtype", dtype] : [])],
                 { stdio: "inherit" });
  }
  return dir;
}

// The 16 prompts (different lengths) of bench_serve and bench_replicas.
const topics = ["the weather in Paris", "a recipe for bread", "the history of computing", "why cats sleep so much",
                "a trip to the mountains", "the rules of chess", "how bridges are built", "the life of bees"];
export const prompts = Array.from({ length: 16 }, (_, i) =>
  `Question ${i}: tell me about ${topics[i % 8]}${i >= 8 ? ", in a few careful sentences, for a curious child" : ""}.`);

// opt-serve on 127.0.0.1 (tests/server/lib.mjs startServer: {url, port, proc, exited, stderr(), stop()}), without
// the tests' OPT_SERVE_ARGS. `opts`: model, tokenizer, port (0: a free one), wrapper, startMs (default 120 s),
// echoStderr.
export function startServe(serve, args, opts) {
  return startServer(args, { startMs: 120000, ...opts, serve, extraArgs: [] });
}

// One streamed greedy completion of `maxTokens` tokens: its text, token count (usage), time to its first text and
// total time (ms). An error event throws.
export async function streamComplete(url, prompt, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, signal: AbortSignal.timeout(600000),
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "", text = "", tokens = 0, ttft = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const c = JSON.parse(ev.slice(6));
      if (c.error) throw new Error(`error event: ${ev}`);
      if (c.usage) tokens = c.usage.completion_tokens;
      for (const ch of c.choices) if (ch.text) { if (!ttft) ttft = performance.now() - t0; text += ch.text; }
    }
  }
  return { text, tokens, ttft, ms: performance.now() - t0 };
}

// CPU seconds (user + system) a process and its children have used so far (/proc/PID/stat; nginx: the master and
// its workers).
const tick = 100;  // USER_HZ on Linux
export function cpuSeconds(pid) {
  const stat = (p) => {
    try {
      const f = readFileSync(`/proc/${p}/stat`, "utf8");
      return f.slice(f.lastIndexOf(")") + 2).split(" ");  // from the state field on
    } catch { return null; }
  };
  let total = 0;
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    const f = stat(d);
    if (f && (Number(d) === pid || Number(f[1]) === pid)) total += (Number(f[11]) + Number(f[12])) / tick;
  }
  return total;
}
