#!/usr/bin/env node
// bench_replicas: aggregate tokens/s of opt-serve replicas behind nginx (deploy/nginx/opt-serve.conf, its ports
// rewritten to free ones and its unused replica lines dropped) against one replica contacted directly, at equal
// threads. On one machine the replicas share its cores, so this measures what nginx and the replica setup cost,
// not how far replicas scale:
//   direct 1x2  one replica, --threads 2, clients talk to it       (the baseline of the two-thread rows)
//   nginx  1x2  the same replica behind nginx                     (nginx's cost)
//   nginx  2x1  two replicas of --threads 1 behind nginx           (two batches of half the size, same threads)
//   direct 1x3  one replica, --threads 3                           (the baseline of the three-thread row)
//   nginx  3x1  three replicas of --threads 1 behind nginx         (3 threads: more than 2 cores, like 1x3)
// (`--cores C` makes the two-thread rows C threads.) Every replica runs with --drain-timeout 30, as the README's
// "Scaling out" says. Each row: --requests greedy streaming /v1/completions (--max-tokens each, prompts from a
// fixed set of 16) from --clients clients at once; each answer must equal the first row's for that prompt (answers
// are checked before they count). The rows run --reps times, interleaved; the table gives each row's mean and range,
// and the CPU time the replicas and nginx used in the timed part (/proc; on a shared machine tokens/s moves with the
// neighbours' load, while nginx's CPU time against the replicas' is the cost of nginx itself).
//
//   node bench/bench_replicas.mjs [--build build] [--model DIR] [--tokenizer DIR] [--cores 2] [--clients 12]
//                                 [--requests 96] [--max-tokens 32] [--reps 3] [--rows 1,2,...] [--json out.json]
//
// The model defaults to the random opt-125m checkpoint bench_serve.mjs uses (written once with opt-make-random).
// Only 127.0.0.1 is contacted; the servers and nginx are started and stopped by the script.
import { writeFileSync } from "node:fs";
import path from "node:path";
import { findNginx, freePort, startNginx } from "../tests/server/nginx_lib.mjs";
import { benchArgs, cpuSeconds, programs, prompts, randomModel, startServe, streamComplete } from "./lib.mjs";

const a = benchArgs({
  cores: { type: "string", default: "2" },
  clients: { type: "string", default: "12" },
  requests: { type: "string", default: "96" },
  "max-tokens": { type: "string", default: "32" },
  reps: { type: "string", default: "3" },
  rows: { type: "string" },
  json: { type: "string" },
});
const { serve } = programs(a.build);
const nginx = findNginx();
const cores = Number(a.cores), clients = Number(a.clients), requests = Number(a.requests);
const maxTokens = Number(a["max-tokens"]);

if (!nginx) throw new Error("nginx is not installed (apt-get install nginx, or OPT_NGINX=path)");
const modelDir = randomModel(a, "bench_replicas");

// ---- servers ----------------------------------------------------------------------------------------------------
async function startReplica(threads) {
  const port = await freePort();
  return startServe(serve, ["--threads", String(threads), "--max-batch", "16", "--max-queue", "256",
                            "--drain-timeout", "30"],
                    { model: modelDir, tokenizer: a.tokenizer, port });
}

// One streamed greedy completion: its text and token count.
const complete = (url, prompt) => streamComplete(url, prompt, maxTokens);

const rows = [
  { name: "direct 1x" + cores, replicas: 1, threads: cores, nginx: false },
  { name: "nginx  1x" + cores, replicas: 1, threads: cores, nginx: true },
  { name: "nginx  2x" + cores / 2, replicas: 2, threads: cores / 2, nginx: true },
  { name: "direct 1x3", replicas: 1, threads: 3, nginx: false },
  { name: "nginx  3x1", replicas: 3, threads: 1, nginx: true },
];
if (!Number.isInteger(cores / 2)) rows.splice(2, 1);
if (a.rows) {  // --rows 1,3: only those rows (1-based, in the order above)
  const keep = new Set(a.rows.split(",").map(Number));
  rows.splice(0, rows.length, ...rows.filter((_, i) => keep.has(i + 1)));
}

const reference = new Map();
async function measure(row) {
  const reps = await Promise.all(Array.from({ length: row.replicas }, () => startReplica(row.threads)));
  let ngx = null;
  try {
    if (row.nginx) ngx = await startNginx(nginx, await freePort(), reps.map((r) => r.port));
    for (const r of reps) await complete(r.url, "warm up");  // pages in each replica's weights
    const url = ngx ? ngx.url : reps[0].url;
    let next = 0, tokens = 0;
    const cpu = () => ({ replicas: reps.reduce((t, r) => t + cpuSeconds(r.proc.pid), 0),
                         nginx: ngx ? cpuSeconds(ngx.proc.pid) : 0 });
    const cpu0 = cpu();
    const t0 = performance.now();
    await Promise.all(Array.from({ length: clients }, async () => {
      for (let i = next++; i < requests; i = next++) {
        const p = prompts[i % prompts.length];
        const d = await complete(url, p);
        if (!reference.has(p)) reference.set(p, d.text);
        else if (reference.get(p) !== d.text) throw new Error(`${row.name}: the answer to "${p}" differs`);
        tokens += d.tokens;
      }
    }));
    const secs = (performance.now() - t0) / 1000;
    const cpu1 = cpu();
    return { tokens, seconds: secs, tokens_per_s: tokens / secs, replica_cpu_s: cpu1.replicas - cpu0.replicas,
             nginx_cpu_s: cpu1.nginx - cpu0.nginx };
  } finally {
    if (ngx) await ngx.stop();
    for (const r of reps) r.proc.kill("SIGTERM");
    for (const r of reps) {
      const { code, signal } = await r.exited;
      if (code !== 0) throw new Error(`${row.name}: a replica exited ${code ?? signal} on SIGTERM:\n${r.stderr()}`);
    }
  }
}

const results = rows.map((r) => ({ ...r, runs: [] }));
for (let rep = 0; rep < Number(a.reps); rep++)
  for (const r of results) {
    const m = await measure(r);
    r.runs.push(m);
    console.log(`bench_replicas rep ${rep + 1} ${r.name}: ${m.tokens_per_s.toFixed(1)} tok/s ` +
                `(${m.tokens} tokens in ${m.seconds.toFixed(1)} s; CPU: replicas ${m.replica_cpu_s.toFixed(1)} s, ` +
                `nginx ${m.nginx_cpu_s.toFixed(2)} s)`);
  }

const mean = (xs) => xs.reduce((s, x) => s + x, 0) / xs.length;
for (const r of results) {
  const t = r.runs.map((m) => m.tokens_per_s);
  r.mean = mean(t);
  r.min = Math.min(...t);
  r.max = Math.max(...t);
  r.nginx_cpu_share = mean(r.runs.map((m) => m.nginx_cpu_s / m.replica_cpu_s));
  r.replica_cpu_ms_per_token = mean(r.runs.map((m) => 1000 * m.replica_cpu_s / m.tokens));
}
const base = (threads) => results.find((r) => !r.nginx && r.threads * r.replicas === threads);
console.log(`\nbench_replicas: ${path.basename(modelDir)} (${modelDir}), ${clients} clients, ${requests} streaming ` +
            `requests of ${maxTokens} tokens per run, ${a.reps} runs per row, answers checked`);
console.log("| setup | threads | tokens/s (mean) | range | vs direct, same threads | replica CPU ms/token | " +
            "nginx CPU / replica CPU |");
console.log("|---|---|---|---|---|---|---|");
for (const r of results) {
  const b = base(r.threads * r.replicas);
  const rel = b && b !== r ? `${(100 * (r.mean / b.mean - 1)).toFixed(1)}%` : "-";
  console.log(`| ${r.name.replace(/ +/, " ")} | ${r.threads * r.replicas} | ${r.mean.toFixed(1)} | ` +
              `${r.min.toFixed(1)}..${r.max.toFixed(1)} | ${rel} | ${r.replica_cpu_ms_per_token.toFixed(1)} | ` +
              `${r.nginx ? (100 * r.nginx_cpu_share).toFixed(2) + "%" : "-"} |`);
}
if (a.json) writeFileSync(a.json, JSON.stringify({ model: modelDir, clients, requests, max_tokens: maxTokens, results },
                                                 null, 2));
