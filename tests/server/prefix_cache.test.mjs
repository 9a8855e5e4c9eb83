// opt-serve's prefix cache (--cache-bytes, --cache-block-tokens): the same prompt twice gives the same answer as the
// goldens and as a server without the cache, and /health counts the hit; prompts sharing a prefix across requests
// hit; /metrics exposes the counters; the budget holds; --cache-bytes 0 turns it off.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, getJson, streamCompletion, goldens } from "./lib.mjs";

const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is";
const LONG = "Once upon a time, in a quiet town by the sea, there lived an old lighthouse keeper who";
const BUDGET = 40 * 2048;  // bytes: 40 blocks of 4 tokens of the fixture (2 layers x 2 x hidden 32 x f32 each)
let warm, cold;

before(async () => {
  [warm, cold] = await Promise.all([
    startServer(["--max-batch", "4", "--cache-bytes", String(BUDGET), "--cache-block-tokens", "4"]),
    startServer(["--max-batch", "4", "--cache-bytes", "0"]),
  ]);
});
after(async () => {
  for (const s of [warm, cold]) {
    const r = await s.stop();
    assert.equal(r.code, 0, "clean exit on SIGTERM:\n" + s.stderr());
  }
});

const stats = async () => {
  const h = await getJson(`${warm.url}/health`);
  assert.equal(h.status, 200);
  assert.ok(h.json.prefix_cache, JSON.stringify(h.json));
  return h.json.prefix_cache;
};
const completion = async (srv, body) => {
  const r = await postJson(`${srv.url}/v1/completions`, body);
  assert.equal(r.status, 200, r.text);
  return r.json.choices.map((c) => [c.text, c.finish_reason]);
};

test("the same prompt twice: the goldens' answer both times, the second a hit", async () => {
  const s0 = await stats();
  assert.equal(s0.block_tokens, 4);
  assert.equal(s0.budget, BUDGET);
  const first = await postJson(`${warm.url}/generate`, { prompts: [P1], max_new_tokens: 8 });
  assert.equal(first.status, 200, first.text);
  const s1 = await stats();
  assert.equal(s1.misses, s0.misses + 1);
  assert.equal(s1.hits, s0.hits);
  assert.ok(s1.blocks >= 1 && s1.bytes > 0, JSON.stringify(s1));
  const again = await postJson(`${warm.url}/generate`, { prompts: [P1], max_new_tokens: 8 });
  const s2 = await stats();
  assert.equal(s2.hits, s1.hits + 1);
  assert.equal(s2.hit_tokens, s1.hit_tokens + 4);  // 7 prompt tokens: one block of 4, the rest computed
  assert.deepEqual(first.json.texts, [G.get(P1).decoded]);
  assert.deepEqual(again.json, first.json);
  // the prompt as ids, streamed and not: the same text as the server without a cache
  const ids = G.get(P1).prompt_ids;
  const body = { prompt: ids, max_tokens: 30, temperature: 0 };
  const want = await completion(cold, body);
  assert.deepEqual(await completion(warm, body), want);
  assert.equal((await streamCompletion(warm.url, body)).text, want[0][0]);
  assert.ok((await stats()).hits >= s2.hits + 2);
});

test("prompts sharing a prefix across requests hit, and answer as without the cache", async () => {
  const bodies = [LONG, LONG + " loved", LONG + " never", `${LONG} never slept, because`].map(
      (prompt) => ({ prompt, max_tokens: 12, temperature: 0 }));
  const want = [];
  for (const b of bodies) want.push(await completion(cold, b));
  const s0 = await stats();
  assert.deepEqual(await completion(warm, bodies[0]), want[0]);
  const s1 = await stats();
  assert.equal(s1.hits, s0.hits);  // nothing of it cached yet
  // the others together, in one batch: each starts from the first prompt's blocks
  const got = await Promise.all(bodies.slice(1).map((b) => completion(warm, b)));
  assert.deepEqual(got, want.slice(1));
  const s2 = await stats();
  assert.equal(s2.hits, s1.hits + 3);
  const tok = await postJson(`${warm.url}/tokenize`, { prompt: LONG });
  const blocks = Math.floor(tok.json.tokens.length / 4);
  assert.ok(s2.hit_tokens - s1.hit_tokens >= 3 * 4 * blocks, JSON.stringify([s1, s2, blocks]));
  // sampling with a seed: the same draws from a cached prefix
  const seeded = { prompt: `${LONG} sang`, max_tokens: 16, temperature: 0.8, top_k: 20, seed: 5 };
  assert.deepEqual(await completion(warm, seeded), await completion(cold, seeded));
  // a batch of prompts in one request
  const batch = { prompts: [P1, P2, LONG, P1], max_new_tokens: 8 };
  assert.deepEqual((await postJson(`${warm.url}/generate`, batch)).json,
                   (await postJson(`${cold.url}/generate`, batch)).json);
});

test("/metrics exposes the counters of /health; the budget holds", async () => {
  // more distinct prompts than the budget holds: blocks are evicted, answers stay the cold server's
  for (let i = 0; i < 12; i++) {
    const body = { prompt: `${i} ${LONG} ${i}`, max_tokens: 4, temperature: 0 };
    assert.deepEqual(await completion(warm, body), await completion(cold, body));
  }
  const s = await stats();
  assert.ok(s.bytes <= BUDGET, JSON.stringify(s));
  assert.ok(s.evictions > 0, JSON.stringify(s));
  const res = await fetch(`${warm.url}/metrics`, { signal: AbortSignal.timeout(20000) });
  assert.equal(res.status, 200);
  const text = await res.text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
    assert.ok(m, `${name} not in /metrics:\n${text}`);
    return Number(m[1]);
  };
  assert.match(text, /^# TYPE opt_serve_prefix_cache_hits_total counter$/m);
  assert.match(text, /^# TYPE opt_serve_prefix_cache_bytes gauge$/m);
  assert.equal(value("opt_serve_prefix_cache_hits_total"), s.hits);
  assert.equal(value("opt_serve_prefix_cache_misses_total"), s.misses);
  assert.equal(value("opt_serve_prefix_cache_hit_tokens_total"), s.hit_tokens);
  assert.equal(value("opt_serve_prefix_cache_evictions_total"), s.evictions);
  assert.equal(value("opt_serve_prefix_cache_bytes"), s.bytes);
});

test("--cache-bytes 0: no prefix cache in /health or /metrics", async () => {
  const h = await getJson(`${cold.url}/health`);
  assert.equal(h.json.prefix_cache, undefined);
  assert.equal(h.json.status, "ok");
  const text = await (await fetch(`${cold.url}/metrics`, { signal: AbortSignal.timeout(20000) })).text();
  assert.doesNotMatch(text, /prefix_cache/);
});
