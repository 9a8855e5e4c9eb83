// POST /tokenize and /detokenize against the fixture tokenizer; --api-key / --api-key-file (401 in the OpenAI
// error format, /health and the page open); GET /metrics parses as Prometheus text (our own reader, and
// parse-prometheus-text-format from npm) and its counters move.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { startServer, postJson, getJson, assertApiError, streamCompletion, goldens, until, CI } from "./lib.mjs";

const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is";

test("tokenize / detokenize: the goldens' ids, and back to the text", async () => {
  const srv = await startServer();
  try {
    for (const p of [P1, P2]) {
      const t = await postJson(`${srv.url}/tokenize`, { prompt: p });
      assert.equal(t.status, 200, t.text);
      assert.deepEqual(t.json, { tokens: G.get(p).prompt_ids });
      const d = await postJson(`${srv.url}/detokenize`, { tokens: t.json.tokens });
      assert.deepEqual(d.json, { prompt: p });
      const bare = await postJson(`${srv.url}/tokenize`, { prompt: p, add_special: false });
      assert.deepEqual(bare.json.tokens, G.get(p).prompt_ids.slice(1), "without BOS");
    }
    const odd = "  spaces , and ünïcödé 😀 ,.";
    const t = await postJson(`${srv.url}/tokenize`, { content: odd });
    assert.equal((await postJson(`${srv.url}/detokenize`, { tokens: t.json.tokens })).json.prompt, odd);
    const bad = [["tokenize", {}, "prompt"], ["tokenize", { prompt: 5 }, "prompt"],
                 ["detokenize", { tokens: "x" }, "tokens"], ["detokenize", { tokens: [-1] }, "tokens"],
                 ["detokenize", { tokens: [1e9] }, "tokens"], ["detokenize", { tokens: [1.5] }, "tokens"]];
    for (const [url, body, param] of bad)
      assertApiError(await postJson(`${srv.url}/${url}`, body), 400, param);
    assertApiError(await postJson(`${srv.url}/tokenize`, "not json"), 400);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("HEAD: a GET endpoint's status and headers without its body", async () => {
  const srv = await startServer();
  try {
    for (const p of ["/", "/health", "/v1/models"]) {
      const get = await fetch(`${srv.url}${p}`);
      const body = await get.text();
      const head = await fetch(`${srv.url}${p}`, { method: "HEAD" });
      assert.equal(head.status, 200, p);
      assert.equal(head.headers.get("content-type"), get.headers.get("content-type"), p);
      if (p === "/") assert.equal(Number(head.headers.get("content-length")), Buffer.byteLength(body));
      assert.equal(await head.text(), "", p);
    }
    assert.equal((await fetch(`${srv.url}/nope`, { method: "HEAD" })).status, 404);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

for (const how of ["--api-key", "--api-key-file"]) {
  test(`${how}: 401 without the key, 200 with it; /health needs none`, async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "opt-serve-key-"));
    const file = path.join(dir, "key");
    writeFileSync(file, "s3cret-key\n");
    const srv = await startServer(how === "--api-key" ? ["--api-key", "s3cret-key"] : ["--api-key-file", file]);
    try {
      const call = (p, key, body) => fetch(`${srv.url}${p}`, {
        method: body ? "POST" : "GET",
        headers: { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      });
      const gen = { prompt: P1, max_tokens: 8, temperature: 0 };
      for (const key of [undefined, "wrong", "s3cret-ke", "s3cret-key2"]) {
        for (const [p, body] of [["/v1/completions", gen], ["/generate", { prompts: [P1] }], ["/v1/models"],
                                 ["/metrics"], ["/tokenize", { prompt: P1 }], ["/detokenize", { tokens: [2] }]]) {
          const r = await call(p, key, body);
          const text = await r.text();
          assertApiError({ status: r.status, text, json: JSON.parse(text) }, 401);
          assert.equal(JSON.parse(text).error.code, "invalid_api_key");
        }
      }
      assert.equal((await call("/health")).status, 200);
      // the page holds no data: a browser loads it without a key (its API key field sends the key for its calls)
      const page = await call("/");
      assert.equal(page.status, 200);
      assert.match(await page.text(), /id="api_key"/);
      const ok = await call("/v1/completions", "s3cret-key", gen);
      assert.equal(ok.status, 200);
      assert.equal((await ok.json()).choices[0].text, G.get(P1).decoded_new);
      assert.equal((await call("/v1/models", "s3cret-key")).status, 200);
      // the openai client sends the key the same way
      const { default: OpenAI } = await import("openai");
      const client = new OpenAI({ apiKey: "s3cret-key", baseURL: `${srv.url}/v1`, maxRetries: 0 });
      const c = await client.completions.create({ model: "opt-tiny-realvocab", ...gen });
      assert.equal(c.choices[0].text, G.get(P1).decoded_new);
      const bad = new OpenAI({ apiKey: "nope", baseURL: `${srv.url}/v1`, maxRetries: 0 });
      await assert.rejects(bad.completions.create({ model: "x", ...gen }), (e) => e.status === 401);
    } finally {
      rmSync(dir, { recursive: true, force: true });
      assert.equal((await srv.stop()).code, 0, srv.stderr());
    }
  });
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$/;

// Parses the Prometheus text format (0.0.4): {samples: Map(name{labels} -> value), types: Map(name -> type)};
// fails on any line that is not a comment, a HELP/TYPE line or a sample.
function parseProm(text) {
  const samples = new Map(), types = new Map();
  assert.ok(text.endsWith("\n"), "ends with a newline");
  for (const line of text.slice(0, -1).split("\n")) {
    let m;
    if ((m = line.match(/^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/))) {
      assert.ok(!types.has(m[1]), `TYPE ${m[1]} twice`);
      types.set(m[1], m[2]);
    } else if (line.startsWith("# HELP ") || line.startsWith("#")) {
      continue;
    } else if ((m = line.match(SAMPLE))) {
      const v = m[3] === "+Inf" ? Infinity : Number(m[3]);
      assert.ok(!Number.isNaN(v), `a sample value: ${line}`);
      const key = m[1] + (m[2] ?? "");
      assert.ok(!samples.has(key), `sample ${key} twice`);
      samples.set(key, v);
    } else {
      assert.fail(`not Prometheus text: ${JSON.stringify(line)}`);
    }
  }
  return { samples, types };
}

// A histogram's buckets are cumulative, +Inf equals _count.
function checkHistogram({ samples, types }, name) {
  assert.equal(types.get(name), "histogram", name);
  const buckets = [...samples].filter(([k]) => k.startsWith(`${name}_bucket{`));
  assert.ok(buckets.length >= 2, name);
  for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i][1] >= buckets[i - 1][1], `${name} cumulative`);
  assert.equal(buckets.at(-1)[0], `${name}_bucket{le="+Inf"}`);
  assert.equal(buckets.at(-1)[1], samples.get(`${name}_count`));
  return samples.get(`${name}_count`);
}

test("GET /metrics: Prometheus text whose counters move with the traffic", async () => {
  const srv = await startServer(["--max-batch", "4"]);
  try {
    const read = async () => {
      const r = await fetch(`${srv.url}/metrics`);
      assert.equal(r.status, 200);
      assert.match(r.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
      return parseProm(await r.text());
    };
    const a = await read();
    const ok = 'opt_serve_requests_total{endpoint="/v1/completions",outcome="ok"}';
    const bad = 'opt_serve_requests_total{endpoint="/v1/completions",outcome="invalid"}';
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0 });
    assert.equal(r.status, 200);
    const s = await streamCompletion(srv.url, { prompt: P2, max_tokens: 8, temperature: 0 });
    assert.ok(s.done);
    assertApiError(await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: -1 }), 400);
    // The server counts a request and its latency when the write of its last byte completes, which the client can
    // see first (a loaded machine, CI's -j2, once read the page between the two): read until both have moved.
    const lat = "opt_serve_request_latency_seconds_count";
    const b = await until(async () => {
      const m = await read();
      return (m.samples.get(ok) ?? 0) - (a.samples.get(ok) ?? 0) >= 2 &&
             (m.samples.get(lat) ?? 0) - (a.samples.get(lat) ?? 0) >= 2 ? m : null;
    }, 5000, "the two completions in the counters");
    for (const t of ["opt_serve_requests_total", "opt_serve_prompt_tokens_total", "opt_serve_generated_tokens_total"])
      assert.equal(b.types.get(t), "counter", t);
    for (const t of ["opt_serve_queue_depth", "opt_serve_running_sequences", "opt_serve_connections"])
      assert.equal(b.types.get(t), "gauge", t);
    assert.equal((b.samples.get(ok) ?? 0) - (a.samples.get(ok) ?? 0), 2);
    assert.equal((b.samples.get(bad) ?? 0) - (a.samples.get(bad) ?? 0), 1);
    const gen = "opt_serve_generated_tokens_total";
    assert.equal(b.samples.get(gen) - a.samples.get(gen), 16);
    assert.equal(b.samples.get("opt_serve_prompt_tokens_total") - a.samples.get("opt_serve_prompt_tokens_total"),
                 G.get(P1).prompt_ids.length + G.get(P2).prompt_ids.length);
    assert.equal(b.samples.get("opt_serve_running_sequences"), 0);
    assert.equal(b.samples.get("opt_serve_queue_depth"), 0);
    assert.ok(checkHistogram(b, "opt_serve_step_seconds") - checkHistogram(a, "opt_serve_step_seconds") >= 8);
    assert.equal(checkHistogram(b, "opt_serve_time_to_first_token_seconds") -
                 checkHistogram(a, "opt_serve_time_to_first_token_seconds"), 2);
    assert.equal(checkHistogram(b, "opt_serve_request_latency_seconds") -
                 checkHistogram(a, "opt_serve_request_latency_seconds"), 2);
    assert.ok(b.samples.get("opt_serve_request_latency_seconds_sum") > 0);
    // /health agrees
    const h = (await getJson(`${srv.url}/health`)).json;
    assert.equal(h.generated_tokens, b.samples.get("opt_serve_generated_tokens_total"));
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

// The same page read by a Prometheus text parser from npm (parse-prometheus-text-format, a port of the Prometheus
// Python client's parser): every family well-formed, typed, with the samples the traffic implies.
const HAVE_PROM = existsSync(new URL("./node_modules/parse-prometheus-text-format/package.json", import.meta.url));
const skipProm = !HAVE_PROM && !CI ? "npm ci --prefix tests/server has not been run" : false;

test("GET /metrics: parsed by parse-prometheus-text-format", { skip: skipProm }, async () => {
  assert.ok(HAVE_PROM, "node_modules/parse-prometheus-text-format is missing: npm ci --prefix tests/server");
  const { default: parseProm } = await import("parse-prometheus-text-format");
  const srv = await startServer(["--lookup", "2"]);  // the speculative counters too
  try {
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: [P1, P2], max_tokens: 8, temperature: 0, n: 2 });
    assert.equal(r.status, 200, r.text);
    assertApiError(await postJson(`${srv.url}/v1/completions`, { prompt: P1, logprobs: 99 }), 400, "logprobs");
    const families = parseProm(await (await fetch(`${srv.url}/metrics`)).text());
    const byName = new Map(families.map((f) => [f.name, f]));
    assert.equal(byName.size, families.length, "each family once");
    for (const f of families) {
      assert.ok(["COUNTER", "GAUGE", "HISTOGRAM"].includes(f.type), `${f.name}: ${f.type}`);
      assert.ok(f.help.length > 0, `${f.name} has HELP`);
      assert.ok(f.metrics.length > 0, `${f.name} has samples`);
      if (f.type === "COUNTER") assert.match(f.name, /_total$/);
    }
    const value = (name, labels = {}) => {
      const f = byName.get(name);
      assert.ok(f, `no ${name}`);
      const m = f.metrics.find((s) => Object.entries(labels).every(([k, v]) => s.labels?.[k] === v));
      assert.ok(m, `${name} ${JSON.stringify(labels)}`);
      return Number(m.value);
    };
    assert.equal(value("opt_serve_requests_total", { endpoint: "/v1/completions", outcome: "ok" }), 1);
    assert.equal(value("opt_serve_requests_total", { endpoint: "/v1/completions", outcome: "invalid" }), 1);
    assert.equal(value("opt_serve_generated_tokens_total"), 4 * 8);  // n = 2 for each of 2 prompts
    assert.equal(value("opt_serve_sequences_completed_total"), 4);
    assert.equal(value("opt_serve_running_sequences"), 0);
    assert.ok(value("opt_serve_draft_tokens_proposed_total") >= value("opt_serve_draft_tokens_accepted_total"));
    for (const h of ["opt_serve_step_seconds", "opt_serve_time_to_first_token_seconds",
                     "opt_serve_request_latency_seconds"]) {
      const f = byName.get(h);
      assert.equal(f.type, "HISTOGRAM", h);
      const { buckets, count, sum } = f.metrics[0];
      // (a JS object lists integer-like keys first: order the bounds by value, +Inf last)
      const les = Object.keys(buckets).sort((x, y) => Number(x) - Number(y));
      assert.ok(les.length >= 5, `${h} buckets`);
      assert.equal(les.at(-1), "+Inf");
      const counts = les.map((le) => Number(buckets[le]));
      for (let i = 1; i < counts.length; i++) assert.ok(counts[i] >= counts[i - 1], `${h} cumulative`);
      assert.equal(counts.at(-1), Number(count));
      assert.ok(Number(sum) > 0, `${h} sum`);
    }
    assert.equal(Number(byName.get("opt_serve_time_to_first_token_seconds").metrics[0].count), 4);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});
