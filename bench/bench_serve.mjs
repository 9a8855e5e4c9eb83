#!/usr/bin/env node
// bench_serve: requests/s, aggregate tokens/s and time to first token (p50, p99) of opt-serve at 1, 4, 16 and 64
// concurrent clients, on a random-weight checkpoint of the opt-125m shape (written once with opt-make-random,
// --dtype f32 or bf16 ...) and the real tokenizer. Each level's line gives its tokens/s against the 1-client level's.
//
//   node bench/bench_serve.mjs [--build build] [--model DIR] [--dtype f32] [--tokenizer DIR] [--clients 1,4,16,64]
//                              [--max-tokens 32] [--threads N] [--max-batch 64] [--json out.json]
//                              [--cache-bytes N] [--prefix N [--reps 5]] [--rounds R]
//
// --rounds R runs the levels R times in turn (1, 4, 16, 64, 1, 4, ...); each level's ratio is against the 1-client
// level of its own round, and a last line per level gives the median over the rounds: on a VM whose memory speed
// changes from one minute to the next, a ratio between runs minutes apart says more about the minute.
//
// Every client sends greedy streaming /v1/completions requests, one after another, with prompts from a fixed
// set of 16 (different lengths). The 1-client level runs each prompt alone first; at every other level each
// answer must equal that one before its numbers count (results are checked before they are reported).
// Each level's line: its figures, its tokens/s against the 1-client level's, the sequences per step of its steps and
// the server's CPU time per token (/proc: on a shared machine tokens/s moves with the neighbours' load, the CPU
// time per token much less). Only 127.0.0.1 is contacted; the server is started and stopped by the script.
//
// --prefix N measures the prefix cache instead: a prompt of N random token ids + 8 more is sent twice, alone; the
// first time it is cold (nothing of it cached), the second its first N tokens (whole blocks) come from the cache.
// Time to first token of each, median of --reps prompts (each a new prefix), and the two answers must be equal.
// --cache-bytes is passed to opt-serve (its default otherwise: 256 MiB).
import { writeFileSync } from "node:fs";
import { benchArgs, cpuSeconds, programs, prompts, randomModel, startServe, streamComplete } from "./lib.mjs";

const a = benchArgs({
  dtype: { type: "string", default: "f32" },
  clients: { type: "string", default: "1,4,16,64" },
  "max-tokens": { type: "string", default: "32" },
  threads: { type: "string", default: "0" },
  "max-batch": { type: "string", default: "64" },
  json: { type: "string" },
  "cache-bytes": { type: "string" },
  prefix: { type: "string" },
  reps: { type: "string", default: "5" },
  rounds: { type: "string", default: "1" },
});
const { serve } = programs(a.build);
const modelDir = randomModel(a, "bench_serve", { dtype: a.dtype });
const maxTokens = Number(a["max-tokens"]);
const levels = a.clients.split(",").map(Number);

// ---- the server -----------------------------------------------------------------------------------------------
const server = await startServe(serve, ["--max-batch", a["max-batch"], "--threads", a.threads, "--max-queue", "256",
                                        ...(a["cache-bytes"] !== undefined ? ["--cache-bytes", a["cache-bytes"]] : [])],
                                { model: modelDir, tokenizer: a.tokenizer, echoStderr: true });
const url = server.url;
const complete = (prompt) => streamComplete(url, prompt, maxTokens);

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

const pct = (xs, p) => {
  const s = [...xs].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};
const reference = new Map();
const results = [];
try {
  await complete("warm up"); // page in the weights
  if (a.prefix !== undefined) {
    await prefixRun(Number(a.prefix), Number(a.reps));
    levels.length = 0;
  }
  const rounds = Math.max(1, Number(a.rounds));
  for (let round = 0; round < rounds; round++)
  for (const clients of levels) {
    const n = clients === 1 ? prompts.length : Math.max(prompts.length, 2 * clients);
    let next = 0;
    const done = [];
    const h0 = await (await fetch(`${url}/health`)).json();
    const cpu0 = cpuSeconds(server.proc.pid);
    const t0 = performance.now();
    await Promise.all(Array.from({ length: clients }, async () => {
      for (let i = next++; i < n; i = next++) {
        const p = prompts[i % prompts.length];
        done.push({ p, ...(await complete(p)) });
      }
    }));
    const secs = (performance.now() - t0) / 1000;
    const cpu = cpuSeconds(server.proc.pid) - cpu0;
    const h1 = await (await fetch(`${url}/health`)).json();
    for (const d of done) {
      if (clients === 1 && !reference.has(d.p)) reference.set(d.p, d.text);
      else if (reference.has(d.p) && reference.get(d.p) !== d.text)
        throw new Error(`at ${clients} clients the answer to "${d.p}" differs from the prompt alone`);
    }
    const tokens = done.reduce((s, d) => s + d.tokens, 0);
    const r = { round, clients, requests: n, seconds: +secs.toFixed(2), requests_per_s: +(n / secs).toFixed(3),
                tokens_per_s: +(tokens / secs).toFixed(1), tokens,
                latency_ms_p50: Math.round(pct(done.map((d) => d.ms), 0.5)),
                ttft_ms_p50: Math.round(pct(done.map((d) => d.ttft), 0.5)),
                ttft_ms_p99: Math.round(pct(done.map((d) => d.ttft), 0.99)),
                sequences_per_step: +((h1.generated_tokens - h0.generated_tokens) / (h1.steps - h0.steps)).toFixed(2),
                server_cpu_s: +cpu.toFixed(2), server_cpu_ms_per_token: +(1000 * cpu / tokens).toFixed(1),
                checked: reference.size > 0 };
    const one = clients === 1 ? r : results.find((x) => x.clients === 1 && x.round === round);
    r.vs_1_client = one ? +(r.tokens_per_s / one.tokens_per_s).toFixed(2) : null;
    results.push(r);
    console.log(`bench_serve opt-125m-shape ${rounds > 1 ? `round=${round + 1} ` : ""}` +
                `clients=${String(clients).padStart(2)} requests=${n} ` +
                `req/s=${r.requests_per_s.toFixed(2)} tok/s=${r.tokens_per_s.toFixed(1)} ` +
                `(${one ? r.vs_1_client.toFixed(2) + "x" : "?"} 1 client) ttft_p50=${r.ttft_ms_p50}ms ` +
                `ttft_p99=${r.ttft_ms_p99}ms latency_p50=${r.latency_ms_p50}ms seq/step=${r.sequences_per_step} ` +
                `server_cpu=${r.server_cpu_ms_per_token}ms/token ` +
                `(max_tokens ${maxTokens}, ${secs.toFixed(1)} s)`);
  }
  if (rounds > 1)
    for (const clients of levels.filter((c) => c !== 1)) {
      const rs = results.filter((x) => x.clients === clients && x.vs_1_client !== null);
      const ratios = rs.map((x) => x.vs_1_client);
      console.log(`bench_serve opt-125m-shape clients=${String(clients).padStart(2)} over ${rounds} rounds: ` +
                  `tok/s against the same round's 1 client median=${pct(ratios, 0.5).toFixed(2)}x ` +
                  `(each: ${ratios.map((x) => x.toFixed(2)).join(", ")}) tok/s median=` +
                  `${pct(rs.map((x) => x.tokens_per_s), 0.5).toFixed(1)}`);
    }
  const h = await (await fetch(`${url}/health`)).json();
  if (levels.length)
    console.log(`bench_serve: ${h.generated_tokens} tokens in ${h.steps} steps ` +
                `(${(h.generated_tokens / h.steps).toFixed(2)} sequences per step on average); answers at every ` +
                `level equal to each prompt alone`);
  if (a.json && levels.length)
    writeFileSync(a.json, JSON.stringify({ model: modelDir, max_tokens: maxTokens, results }, null, 2));
} finally {
  await server.stop(30000);
}
