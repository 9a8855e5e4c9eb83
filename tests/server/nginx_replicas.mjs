// Three opt-serve replicas behind nginx with the real deploy/nginx/opt-serve.conf (its ports rewritten to free
// ones, nothing else): 48 concurrent clients mix /generate, streaming and non-streaming /v1/completions.
// - One replica gets SIGTERM halfway (it runs with --drain-timeout): every request still gets its correct answer
//   (the one a replica gives the request alone, and Hugging Face's golden for the golden prompts) and no client
//   sees anything but 200; the drained replica finishes the work it had and exits 0.
// - Another run SIGKILLs a replica halfway: only streams that had begun on that replica and had not ended may
//   fail (cut off, with a correct prefix of their answer); everything else, including the non-streaming requests
//   it was running (nginx runs them again elsewhere), gets its correct answer.
// Run directly by ctest (not with --test): it exits 77, reported as skipped, when nginx is not installed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, goldens, manyPrompts, sseData, until } from "./lib.mjs";
import { findNginx, freePort, startNginx } from "./nginx_lib.mjs";

const NGINX = findNginx();
if (!NGINX) {
  console.log("nginx is not installed (apt-get install nginx, or OPT_NGINX=path): skipped");
  process.exit(77);
}

const G = goldens();
const REPLICA_ARGS = ["--drain-timeout", "30", "--threads", "1", "--http-threads", "1", "--max-batch", "16",
                      "--max-queue", "64", "--step-delay-ms", "4"];
let replicas = [], ngx, alone, JOBS, WANT;

before(async () => {
  // `alone` answers each request by itself (no step delay: the references come fast); the replicas are slowed
  // down so that requests overlap and are still running when a replica is stopped
  [alone, ...replicas] = await Promise.all([["--threads", "1"], REPLICA_ARGS, REPLICA_ARGS, REPLICA_ARGS]
    .map((a) => startServer(a)));
  ngx = await startNginx(NGINX, await freePort(), replicas.map((r) => r.port));
  JOBS = jobs();
  WANT = await references(JOBS);
});
after(async () => {
  await Promise.all([alone, ...replicas].map((r) => r && r.stop().catch(() => {})));
  if (ngx) await ngx.stop();
});

const addr = (r) => `127.0.0.1:${r.port}`;

// The jobs: 48 clients x 4 requests, prompts of different lengths and budgets, every kind; the golden prompts
// (greedy, their golden length) on each kind.
function jobs() {
  const kinds = ["generate", "complete", "stream"];
  const prompts = manyPrompts(40);
  const out = [];
  for (let i = 0; i < 192; i++)
    out.push({ kind: kinds[i % 3], prompt: prompts[(i * 7) % 40], max_tokens: 6 + ((i * 5) % 25) });
  let i = 0;
  for (const [prompt, golden] of G)
    for (const kind of kinds) out[(i++) * 17 + 5] = { kind, prompt, max_tokens: golden.max_new_tokens, golden };
  return out;
}

// One request through `url`: {status, text, upstream, start, end, error, partial}. Streams are read piece by piece,
// so that a cut-off stream still tells what it had received.
async function run(url, job) {
  const r = { status: 0, text: null, upstream: "", start: Date.now(), end: 0, error: null, partial: "" };
  try {
    const isGen = job.kind === "generate";
    const body = isGen ? { prompts: [job.prompt], max_new_tokens: job.max_tokens }
                       : { prompt: job.prompt, max_tokens: job.max_tokens, temperature: 0,
                           stream: job.kind === "stream" };
    const res = await fetch(url + (isGen ? "/generate" : "/v1/completions"), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: AbortSignal.timeout(60000),
    });
    r.status = res.status;
    r.upstream = res.headers.get("x-upstream") ?? "";
    if (job.kind !== "stream") {
      const t = await res.text();
      if (res.status === 200) r.text = isGen ? JSON.parse(t).texts[0] : JSON.parse(t).choices[0].text;
      else r.error = `status ${res.status}: ${t}`;
    } else {
      let raw = "";
      const dec = new TextDecoder();
      try {
        for await (const chunk of res.body) {
          raw += dec.decode(chunk, { stream: true });
          r.partial = streamText(raw.slice(0, raw.lastIndexOf("\n\n") + 2)).text;
        }
      } catch (e) {
        throw new Error(`stream cut off: ${e.cause?.message ?? e.message}`);
      }
      const s = streamText(raw);
      if (res.status !== 200) r.error = `status ${res.status}: ${raw}`;
      else if (!s.done) r.error = `stream without [DONE]: ${raw.slice(-200)}`;
      else if (s.errors.length) r.error = `error event: ${s.errors[0]}`;
      else r.text = s.text;
    }
  } catch (e) {
    r.error = String(e.message ?? e);
  }
  r.end = Date.now();
  return r;
}

function streamText(raw) {
  const s = { text: "", done: false, errors: [] };
  for (const d of sseData(raw)) {
    if (d === "[DONE]") { s.done = true; continue; }
    const c = JSON.parse(d);
    if (c.error) s.errors.push(d);
    else for (const ch of c.choices) s.text += ch.text;
  }
  return s;
}

// Each job's answer alone: one request at a time, straight to a server of its own.
async function references(js) {
  const out = [];
  for (const j of js) {
    const r = await run(alone.url, j);
    assert.equal(r.error, null, `alone: ${j.kind} ${JSON.stringify(j.prompt)}: ${r.error}`);
    if (j.golden) assert.equal(r.text, j.kind === "generate" ? j.golden.decoded : j.golden.decoded_new, j.prompt);
    out.push(r.text);
  }
  return out;
}

// 48 clients, each running its share of `js` one after another; `halfway` runs once half of them are done.
async function mix(js, halfway) {
  const results = new Array(js.length);
  let done = 0, fired = null;
  const clients = Array.from({ length: 48 }, async (_, c) => {
    for (let i = c; i < js.length; i += 48) {
      results[i] = await run(ngx.url, js[i]);
      if (++done === js.length / 2) fired = halfway();
    }
  });
  await Promise.all(clients);
  return { results, at: await fired };
}

const healthOf = async (r) => (await fetch(`${r.url}/health`, { signal: AbortSignal.timeout(5000) })).json();

test("SIGTERM to a replica halfway: it drains, and every client gets its correct answer, never a 5xx",
     async () => {
  const js = JOBS, want = WANT;
  const victim = replicas[1];
  let inflight = 0;
  const { results, at } = await mix(js, async () => {
    const h = await healthOf(victim);
    inflight = h.active + h.queued;
    victim.proc.kill("SIGTERM");
    return Date.now();
  });
  const bad = results.map((r, i) => ({ ...r, i })).filter((r) => r.error !== null || r.text !== want[r.i]);
  assert.deepEqual(bad.map((r) => `${js[r.i].kind} ${r.status} ${r.error ?? "wrong answer"} via ${r.upstream}`), []);
  assert.ok(results.every((r) => r.status === 200));
  // the drain finished the work the replica held and the process exited 0
  const { code } = await victim.exited;
  const exitMs = Date.now() - at;
  assert.equal(code, 0, victim.stderr());
  assert.match(victim.stderr(), /draining[\s\S]*drained/);
  const finishedThere = results.filter((r) => r.upstream.split(", ").at(-1) === addr(victim) && r.end > at).length;
  const retried = results.filter((r) => r.upstream.includes(",")).length;
  console.log(`SIGTERM: the replica held ${inflight} sequences; ${finishedThere} answers came from it after the ` +
              `signal; ${retried} requests were retried by nginx; it exited ${exitMs} ms after the signal`);
  assert.ok(inflight > 0, "the replica had no work when it got SIGTERM: the test proves nothing");
  assert.ok(finishedThere > 0, "no answer came from the draining replica after SIGTERM");
});

test("SIGKILL to a replica halfway: only its running streams fail, and only cut off", async () => {
  // replica 1 back on its port (nginx takes it again after fail_timeout; it is not needed before)
  replicas[1] = await startServer(REPLICA_ARGS, { port: replicas[1].port });
  const js = JOBS, want = WANT;
  const victim = replicas[2];
  const { results, at } = await mix(js, async () => {
    victim.proc.kill("SIGKILL");
    return Date.now();
  });
  const { signal } = await victim.exited;
  assert.equal(signal, "SIGKILL");
  // what was on the victim when it died: begun before, ended after, sent to it (the streams: the replica that
  // answered them; the others: a retry lists it first)
  const onVictim = results.map((r, i) => ({ ...r, i }))
    .filter((r) => r.start <= at && r.end >= at && r.upstream.split(", ").includes(addr(victim)));
  const mayFail = new Set(onVictim.filter((r) => js[r.i].kind === "stream" &&
                                               r.upstream.split(", ").at(-1) === addr(victim)).map((r) => r.i));
  const failed = results.map((r, i) => ({ ...r, i })).filter((r) => r.error !== null || r.text !== want[r.i]);
  for (const f of failed) {
    assert.ok(mayFail.has(f.i), `request ${f.i} (${js[f.i].kind}, via ${f.upstream || "?"}) failed, and it was not ` +
                                `a stream running on the killed replica: ${f.error ?? "wrong answer"}`);
    assert.equal(f.status, 200, f.error);
    assert.ok(want[f.i].startsWith(f.partial), `the cut-off stream ${f.i} received text that is not its answer's`);
  }
  assert.ok(failed.length <= mayFail.size);
  console.log(`SIGKILL: ${onVictim.length} requests were on the killed replica (${mayFail.size} streams); ` +
              `${failed.length} streams failed; ${results.length - failed.length} of ${results.length} correct`);
  assert.ok(onVictim.length > 0, "the killed replica had no work: the test proves nothing");
  // the survivors still serve
  const hello = () => postJson(`${ngx.url}/generate`, { prompts: ["Hello"], max_new_tokens: 2 });
  await until(async () => (await hello()).status === 200, 5000, "an answer through nginx after the kill");
});
