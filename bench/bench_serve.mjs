#!/usr/bin/env node
// bench_serve: requests/s and tokens/s of opt-serve at 1, 4 and 16 concurrent clients, on a random-weight
// checkpoint of the opt-125m shape (written once with opt-make-random) and the real tokenizer.
//
//   node bench/bench_serve.mjs [--build build] [--model DIR] [--tokenizer DIR] [--clients 1,4,16]
//                              [--max-tokens 32] [--threads N] [--max-batch 16] [--json out.json]
//                              [--cache-bytes N] [--prefix N [--reps 5]]
//
// Every client sends greedy streaming /v1/completions requests, one after another, with prompts from a fixed
// set of 16 (different lengths). The 1-client level runs each prompt alone first; at every other level each
// answer must equal that one before its numbers count (results are checked before they are reported).
// Only 127.0.0.1 is contacted; the server is started and stopped by the script.
//
// --prefix N measures the prefix cache instead: a prompt of N random token ids + 8 more is sent twice, alone; the
// first time it is cold (nothing of it cached), the second its first N tokens (whole blocks) come from the cache.
// Time to first token of each, median of --reps prompts (each a new prefix), and the two answers must be equal.
// --cache-bytes is passed to opt-serve (its default otherwise: 256 MiB).
import { spawn, execFileSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";

const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.resolve(here, "..");
const { values: a } = parseArgs({
  options: {
    build: { type: "string", default: path.join(root, "build") },
    model: { type: "string" },
    tokenizer: { type: "string", default: path.resolve(root, "../shared/tokenizer") },
    clients: { type: "string", default: "1,4,16" },
    "max-tokens": { type: "string", default: "32" },
    threads: { type: "string", default: "0" },
    "max-batch": { type: "string", default: "16" },
    json: { type: "string" },
    "cache-bytes": { type: "string" },
    prefix: { type: "string" },
    reps: { type: "string", default: "5" },
  },
});
const serve = path.join(a.build, "examples", "opt-serve");
const makeRandom = path.join(a.build, "examples", "opt-make-random");
const modelDir = a.model ?? path.join(process.env.OPT_BENCH_DIR ?? path.join(a.build, "bench-models"), "opt-125m-f32");
const maxTokens = Number(a["max-tokens"]);
const levels = a.clients.split(",").map(Number);

if (!existsSync(serve)) throw new Error(`${serve} not found: build the opt-serve target (or pass --build)`);
if (!existsSync(path.join(modelDir, "config.json"))) {
  if (!existsSync(makeRandom)) throw new Error(`${modelDir} has no checkpoint and ${makeRandom} is not built`);
  console.error(`bench_serve: writing a random opt-125m checkpoint to ${modelDir}`);
  execFileSync(makeRandom, [modelDir, "--model", "opt-125m"], { stdio: "inherit" });
}

const topics = ["the weather in Paris", "a recipe for bread", "the history of computing", "why cats sleep so much",
                "a trip to the mountains", "the rules of chess", "how bridges are built", "the life of bees"];
const prompts = Array.from({ length: 16 }, (_, i) =>
  `Question ${i}: tell me about ${topics[i % 8]}${i >= 8 ? ", in a few careful sentences, for a curious child" : ""}.`);

// ---- the server -----------------------------------------------------------------------------------------------
const proc = spawn(serve, ["-m", modelDir, "-t", a.tokenizer, "--host", "127.0.0.1", "--port", "0",
                           "--max-batch", a["max-batch"], "--threads", a.threads, "--max-queue", "256",
                           ...(a["cache-bytes"] !== undefined ? ["--cache-bytes", a["cache-bytes"]] : [])],
                   { stdio: ["ignore", "pipe", "inherit"] });
const port = await new Promise((resolve, reject) => {
  let out = "";
  const t = setTimeout(() => reject(new Error("opt-serve did not start in 120 s")), 120000);
  proc.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) { clearTimeout(t); resolve(Number(m[1])); }
  });
  proc.on("exit", (c) => { clearTimeout(t); reject(new Error(`opt-serve exited (${c})`)); });
});
const url = `http://127.0.0.1:${port}`;

// One streamed greedy completion: its text, token count, time to first text and total time.
async function complete(prompt) {
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
      if (c.usage) tokens = c.usage.completion_tokens;
      for (const ch of c.choices) if (ch.text) { if (!ttft) ttft = performance.now() - t0; text += ch.text; }
    }
  }
  return { text, tokens, ttft, ms: performance.now() - t0 };
}

// --prefix N: time to first token, cold then with the prompt's first N tokens cached.
async function prefixRun(n, reps) {
  let x = 12345;
  const ids = (k) => Array.from({ length: k }, () => 4 + ((x = (x * 48271) % 2147483647) % 50000));
  const cold = [], warm = [];
  for (let r = 0; r < reps; r++) {
    const prompt = [2, ...ids(n - 1), ...ids(8)];
    const a1 = await complete(prompt), a2 = await complete(prompt);
    if (a1.text !== a2.text) throw new Error(`the answer with the prefix cached differs from the cold one (rep ${r})`);
    cold.push(a1.ttft);
    warm.push(a2.ttft);
  }
  const h = await (await fetch(`${url}/health`)).json();
  const med = (xs) => pct(xs, 0.5);
  console.log(`bench_serve opt-125m-shape prefix=${n} prompt=${n + 8} tokens reps=${reps}: ttft cold ` +
              `p50=${med(cold).toFixed(1)}ms warm p50=${med(warm).toFixed(1)}ms ` +
              `speedup=${(med(cold) / med(warm)).toFixed(2)}x (answers equal; ` +
              `prefix_cache ${JSON.stringify(h.prefix_cache)})`);
  if (a.json)
    writeFileSync(a.json, JSON.stringify({ model: modelDir, prefix: n, cold_ms: cold, warm_ms: warm }, null, 2));
}

const pct = (xs, p) => { const s = [...xs].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const reference = new Map();
const results = [];
try {
  await complete("warm up"); // page in the weights
  if (a.prefix !== undefined) {
    await prefixRun(Number(a.prefix), Number(a.reps));
    levels.length = 0;
  }
  for (const clients of levels) {
    const n = clients === 1 ? prompts.length : Math.max(prompts.length, 2 * clients);
    let next = 0;
    const done = [];
    const t0 = performance.now();
    await Promise.all(Array.from({ length: clients }, async () => {
      for (let i = next++; i < n; i = next++) {
        const p = prompts[i % prompts.length];
        done.push({ p, ...(await complete(p)) });
      }
    }));
    const secs = (performance.now() - t0) / 1000;
    for (const d of done) {
      if (clients === 1 && !reference.has(d.p)) reference.set(d.p, d.text);
      else if (reference.has(d.p) && reference.get(d.p) !== d.text)
        throw new Error(`at ${clients} clients the answer to "${d.p}" differs from the prompt alone`);
    }
    const tokens = done.reduce((s, d) => s + d.tokens, 0);
    const r = { clients, requests: n, seconds: +secs.toFixed(2), requests_per_s: +(n / secs).toFixed(3),
                tokens_per_s: +(tokens / secs).toFixed(1), tokens,
                latency_ms_p50: Math.round(pct(done.map((d) => d.ms), 0.5)),
                ttft_ms_p50: Math.round(pct(done.map((d) => d.ttft), 0.5)),
                checked: reference.size > 0 };
    results.push(r);
    console.log(`bench_serve opt-125m-shape clients=${String(clients).padStart(2)} requests=${n} ` +
                `req/s=${r.requests_per_s.toFixed(2)} tok/s=${r.tokens_per_s.toFixed(1)} ` +
                `latency_p50=${r.latency_ms_p50}ms ttft_p50=${r.ttft_ms_p50}ms (max_tokens ${maxTokens}, ${secs.toFixed(1)} s)`);
  }
  const h = await (await fetch(`${url}/health`)).json();
  if (levels.length)
    console.log(`bench_serve: ${h.generated_tokens} tokens in ${h.steps} steps ` +
                `(${(h.generated_tokens / h.steps).toFixed(2)} sequences per step on average); answers at every ` +
                `level equal to each prompt alone`);
  if (a.json && levels.length)
    writeFileSync(a.json, JSON.stringify({ model: modelDir, max_tokens: maxTokens, results }, null, 2));
} finally {
  proc.kill("SIGTERM");
}
