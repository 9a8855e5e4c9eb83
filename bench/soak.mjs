#!/usr/bin/env node
// soak: one opt-serve under a long mixed load (issue 14; not run by CI). For --minutes (default 10) it runs
//   - --clients clients (default 8), each sending one request after another, drawn from: /generate,
//     non-streaming and streaming /v1/completions (greedy, and seeded sampling), and requests the client
//     abandons (a stream aborted after a few tokens, a non-streaming request aborted while it runs);
//   - --slow slow connections (default 32), slowloris-style: half send a request head one byte at a time, half a
//     head and then a body one byte at a time; the server's deadlines close them and each is opened again;
// and checks: every answer that completes equals the same request's answer alone (taken before the load), no
// request gets an error, the server never exits, and it stops cleanly (SIGTERM, status 0) at the end. Every
// --sample seconds it reads the server's RSS (VmRSS of /proc/PID/status) and /health; it reports the RSS after
// --warmup seconds against the RSS at the end (flat: within --rss-tolerance MB).
//
//   node bench/soak.mjs [--build build] [--model DIR] [--tokenizer DIR] [--minutes 10] [--clients 8]
//                       [--slow 32] [--sample 5] [--warmup 60] [--rss-tolerance 8] [--json out.json]
//
// The server runs under `nice -n 19` (it shares the machine); only 127.0.0.1 is contacted. Exit status 0 when
// every check held, 1 otherwise.
import { readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { benchArgs, programs, root, startServe } from "./lib.mjs";

const a = benchArgs({
  minutes: { type: "string", default: "10" },
  clients: { type: "string", default: "8" },
  slow: { type: "string", default: "32" },
  sample: { type: "string", default: "5" },
  warmup: { type: "string", default: "60" },
  "rss-tolerance": { type: "string", default: "8" },
  json: { type: "string" },
}, { model: path.resolve(root, "../shared/fixtures/opt-tiny-realvocab") });
const { serve } = programs(a.build);
const durationMs = Number(a.minutes) * 60000, sampleMs = Number(a.sample) * 1000, warmupMs = Number(a.warmup) * 1000;

// ---- the server (short deadlines so that the slow connections cycle) ---------------------------------------------
const server = await startServe(serve, ["--max-batch", "16", "--max-queue", "256", "--head-timeout", "5",
                                        "--body-timeout", "5"],
                                { model: a.model, tokenizer: a.tokenizer, wrapper: ["nice", "-n", "19"],
                                  startMs: 60000 });
const { proc, exited, port, url } = server;
const rssKb = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, "utf8"))[1]);

// ---- the requests ---------------------------------------------------------------------------------------------
const topics = ["the sea", "a long train journey", "bread", "the moon landing", "a quiet village", "chess",
                "the first computers", "bees in winter", "an old lighthouse", "rain in the city"];
const specs = [];
for (let i = 0; i < 30; i++) {
  const prompt = `Story ${i}: a few words about ${topics[i % 10]}` +
                 `${i >= 10 ? ", told slowly" : ""}${i >= 20 ? " by a child" : ""}`;
  const max_tokens = 4 + ((i * 11) % 40);
  const sampling = i % 3 === 2 ? { temperature: 0.8, top_p: 0.9, seed: 7 + i } : { temperature: 0 };
  specs.push({ prompt, max_tokens, sampling });
}

async function generate(s, signal) {
  const res = await fetch(`${url}/generate`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompts: [s.prompt], max_new_tokens: s.max_tokens }), signal });
  const t = await res.text();
  if (res.status !== 200) throw new Error(`/generate: ${res.status} ${t}`);
  return JSON.parse(t).texts[0];
}
async function complete(s, signal) {
  const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: s.prompt, max_tokens: s.max_tokens, ...s.sampling }), signal });
  const t = await res.text();
  if (res.status !== 200) throw new Error(`/v1/completions: ${res.status} ${t}`);
  return JSON.parse(t).choices[0].text;
}
// A stream read to its end, or (`abortAfter` pieces) abandoned there.
async function stream(s, signal, abortAfter = 0, ac = null) {
  const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: s.prompt, max_tokens: s.max_tokens, ...s.sampling, stream: true }), signal });
  if (res.status !== 200) throw new Error(`stream: ${res.status} ${await res.text()}`);
  let raw = "", text = "", done = false, pieces = 0;
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    raw += dec.decode(chunk, { stream: true });
    let cut;
    while ((cut = raw.indexOf("\n\n")) >= 0) {
      const ev = raw.slice(0, cut);
      raw = raw.slice(cut + 2);
      if (!ev.startsWith("data: ")) continue;
      if (ev === "data: [DONE]") { done = true; continue; }
      const c = JSON.parse(ev.slice(6));
      if (c.error) throw new Error(`stream error event: ${ev}`);
      for (const ch of c.choices) text += ch.text;
      if (abortAfter && ++pieces >= abortAfter) { ac.abort(); return null; }
    }
  }
  if (!done) throw new Error("stream ended without [DONE]");
  return text;
}

// ---- the load ---------------------------------------------------------------------------------------------------
const stats = { ok: 0, cancelled: 0, errors: 0, wrong: 0, slow_opened: 0, slow_closed_by_server: 0 };
const errors = [];
const note = (what) => { if (errors.length < 20) errors.push(what); };

// the answers alone, before the load
const want = [];
for (const s of specs) want.push({ generate: await generate(s), complete: await complete(s), stream: await stream(s) });

const t0 = Date.now();
const endAt = t0 + durationMs;
let rng = 12345;
const rand = (n) => { rng = (rng * 1103515245 + 12345) % 2147483648; return rng % n; };

async function client() {
  while (Date.now() < endAt) {
    const i = rand(specs.length), s = specs[i], kind = rand(10);
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new Error("no answer in 120 s")), 120000);
    try {
      if (kind < 2) check(i, "generate", await generate(s, ac.signal));
      else if (kind < 5) check(i, "complete", await complete(s, ac.signal));
      else if (kind < 8) check(i, "stream", await stream(s, ac.signal));
      else if (kind === 8) {  // a stream abandoned after a few pieces
        await stream({ ...s, max_tokens: 40 }, ac.signal, 1 + rand(3), ac);
        stats.cancelled++;
      } else {  // a non-streaming request abandoned while it runs
        const p = complete({ ...s, max_tokens: 40 }, ac.signal);
        setTimeout(() => ac.abort(), 1 + rand(20));
        try { await p; stats.ok++; } catch (e) { if (e.name !== "AbortError") throw e; stats.cancelled++; }
      }
    } catch (e) {
      if (e.name === "AbortError" && kind === 8) stats.cancelled++;
      else { stats.errors++; note(`${new Date().toISOString()} ${e.message ?? e}`); }
    } finally {
      clearTimeout(timer);
    }
  }
}
function check(i, kind, text) {
  if (text === want[i][kind]) stats.ok++;
  else {
    stats.wrong++;
    note(`wrong ${kind} answer for spec ${i}: ${JSON.stringify(text)} != ${JSON.stringify(want[i][kind])}`);
  }
}

// A slow connection: a head (or a head and then a body) one byte every 250 ms, opened again when the server closes it.
function slowConnection(n) {
  const head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const body = JSON.stringify({ prompt: "slow", max_tokens: 2 });
  const text = n % 2 ? head + "X-Slow: " + "a".repeat(2000) : head + `Content-Length: ${body.length}\r\n\r\n${body}`;
  const open = () => {
    if (Date.now() >= endAt) return;
    const s = net.connect(port, "127.0.0.1");
    let pos = n % 2 ? 0 : head.length + `Content-Length: ${body.length}\r\n\r\n`.length;
    let timer = null;
    const end = setTimeout(() => s.destroy(), Math.max(0, endAt - Date.now()));
    s.on("connect", () => {
      stats.slow_opened++;
      if (pos > 0) s.write(text.slice(0, pos));  // the body kind: the head at once
      timer = setInterval(() => { if (pos < text.length - 1) s.write(text[pos++]); }, 250);
    });
    s.on("data", () => {});
    s.on("error", () => {});
    s.on("close", () => {
      clearInterval(timer);
      clearTimeout(end);
      if (Date.now() < endAt) stats.slow_closed_by_server++;  // its deadline: the server closed it
      setTimeout(open, 100);
    });
  };
  open();
}

const samples = [];
async function sample() {
  const h = await (await fetch(`${url}/health`, { signal: AbortSignal.timeout(10000) })).json();
  const r = { t_s: Math.round((Date.now() - t0) / 1000), rss_mb: +(rssKb() / 1024).toFixed(1), active: h.active,
              queued: h.queued, completed: h.completed, cancelled: h.cancelled, kv_cache_bytes: h.kv_cache_bytes,
              ok: stats.ok, errors: stats.errors + stats.wrong };
  samples.push(r);
  console.log(`soak t=${String(r.t_s).padStart(4)}s rss=${r.rss_mb.toFixed(1)} MB active=${r.active} ` +
              `queued=${r.queued} completed=${r.completed} cancelled=${r.cancelled} kv=${r.kv_cache_bytes} ` +
              `ok=${r.ok} errors=${r.errors}`);
}

let crashed = false;
exited.then(() => { crashed = Date.now() < endAt; });
for (let i = 0; i < Number(a.slow); i++) slowConnection(i);
const sampler = (async () => {
  while (Date.now() < endAt && !crashed) {
    await sample().catch((e) => { stats.errors++; note(`sample: ${e.message}`); });
    await new Promise((r) => setTimeout(r, Math.min(sampleMs, Math.max(0, endAt - Date.now()))));
  }
})();
await Promise.all([...Array.from({ length: Number(a.clients) }, client), sampler]);
if (!crashed) await sample();
await new Promise((r) => setTimeout(r, 1000));

// ---- the verdict ----------------------------------------------------------------------------------------------
const warm = samples.find((s) => s.t_s * 1000 >= warmupMs) ?? samples[0];
const last = samples.at(-1);
const after = samples.filter((s) => s.t_s >= warm.t_s).map((s) => s.rss_mb);
const drift = +(last.rss_mb - warm.rss_mb).toFixed(1);
let stop = { code: null, signal: null };
if (!crashed) {
  proc.kill("SIGTERM");
  stop = await exited;
}
const checks = {
  no_errors: stats.errors === 0 && stats.wrong === 0,
  no_crash: !crashed,
  clean_exit: stop.code === 0,
  rss_flat: Math.abs(drift) <= Number(a["rss-tolerance"]),
};
const report = { minutes: Number(a.minutes), model: a.model, clients: Number(a.clients), slow: Number(a.slow), stats,
                 rss_mb: { warm_at_s: warm.t_s, warm: warm.rss_mb, end: last.rss_mb, drift, min_after_warmup:
                   Math.min(...after), max_after_warmup: Math.max(...after) },
                 checks, errors, samples };
console.log(`soak: ${a.minutes} min, ${stats.ok} answers correct, ${stats.cancelled} abandoned by their client, ` +
            `${stats.errors} errors, ${stats.wrong} wrong; ${stats.slow_opened} slow connections opened, ` +
            `${stats.slow_closed_by_server} closed by the server`);
console.log(`soak: RSS ${warm.rss_mb} MB at ${warm.t_s} s (after warm-up) -> ${last.rss_mb} MB at ${last.t_s} s ` +
            `(drift ${drift} MB; ${Math.min(...after)}..${Math.max(...after)} MB after warm-up)`);
console.log(`soak: checks ${JSON.stringify(checks)}`);
for (const e of errors) console.log(`soak: error: ${e}`);
if (crashed) console.log(`soak: the server exited during the run:\n${server.stderr()}`);
if (a.json) writeFileSync(a.json, JSON.stringify(report, null, 2));
process.exit(Object.values(checks).every((c) => c) ? 0 : 1);
