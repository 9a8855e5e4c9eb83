// The seed's /generate and /v1/completions against the realvocab fixture's goldens (HF transformers' output),
// streaming equal to non-streaming, stop strings, /v1/models, /health and the page at "/".
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, getJson, streamCompletion, goldens } from "./lib.mjs";

let srv;
const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is", P3 = "Once upon a time";

before(async () => { srv = await startServer(["--max-batch", "4"]); });
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, "clean exit on SIGTERM:\n" + srv.stderr());
});

test("POST /generate: the seed's contract, texts equal HF's batch_decode of each prompt alone", async () => {
  const prompts = [P1, P2, P3];
  const r = await postJson(`${srv.url}/generate`, { prompts, max_new_tokens: 8 });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(Object.keys(r.json), ["texts"]);
  assert.deepEqual(r.json.texts, prompts.map((p) => G.get(p).decoded));
  for (let i = 0; i < prompts.length; i++) assert.ok(r.json.texts[i].startsWith(prompts[i]));
});

test("POST /generate: one prompt; default max_new_tokens (50) shrinks to the context", async () => {
  const one = await postJson(`${srv.url}/generate`, { prompts: [P1], max_new_tokens: 8 });
  assert.deepEqual(one.json.texts, [G.get(P1).decoded]);
  const d = await postJson(`${srv.url}/generate`, { prompts: [P1] });
  assert.equal(d.status, 200, d.text);
  assert.ok(d.json.texts[0].startsWith(G.get(P1).decoded), "the first 8 tokens are the golden's");
  const z = await postJson(`${srv.url}/generate`, { prompts: [P2], max_new_tokens: 0 });
  assert.deepEqual(z.json.texts, [P2]);
});

test("POST /v1/completions: greedy text, finish_reason, usage", async () => {
  const r = await postJson(`${srv.url}/v1/completions`,
                           { model: "opt-tiny-realvocab", prompt: P1, max_tokens: 8, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  const b = r.json;
  assert.equal(b.object, "text_completion");
  assert.match(b.id, /^cmpl-/);
  assert.equal(typeof b.created, "number");
  assert.equal(b.model, "opt-tiny-realvocab");
  assert.equal(b.choices.length, 1);
  assert.deepEqual(b.choices[0], { text: G.get(P1).decoded_new, index: 0, logprobs: null, finish_reason: "length" });
  const plen = G.get(P1).prompt_ids.length;
  assert.deepEqual(b.usage, { prompt_tokens: plen, completion_tokens: 8, total_tokens: plen + 8 });
});

test("POST /v1/completions: a list of prompts, token-id prompts, echo", async () => {
  const r = await postJson(`${srv.url}/v1/completions`, { prompt: [P1, P2, P3], max_tokens: 8, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(r.json.choices.map((c) => c.text), [P1, P2, P3].map((p) => G.get(p).decoded_new));
  const ids = await postJson(`${srv.url}/v1/completions`,
                             { prompt: G.get(P2).prompt_ids, max_tokens: 8, temperature: 0 });
  assert.equal(ids.json.choices[0].text, G.get(P2).decoded_new);
  const lists = await postJson(`${srv.url}/v1/completions`,
                               { prompt: [G.get(P1).prompt_ids, G.get(P3).prompt_ids], max_tokens: 8, temperature: 0 });
  assert.deepEqual(lists.json.choices.map((c) => c.text), [G.get(P1).decoded_new, G.get(P3).decoded_new]);
  const echo = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0, echo: true });
  assert.equal(echo.json.choices[0].text, G.get(P1).decoded);
});

test("POST /v1/completions stream: SSE chunks concatenate to the non-streamed text, then [DONE]", async () => {
  for (const p of [P1, P2, P3]) {
    const s = await streamCompletion(srv.url, { prompt: p, max_tokens: 8, temperature: 0,
                                                stream_options: { include_usage: true } });
    assert.equal(s.text, G.get(p).decoded_new);
    assert.equal(s.finish_reason, "length");
    assert.ok(s.done, "ends with data: [DONE]");
    assert.ok(s.chunks >= 4, `streamed in pieces (${s.chunks} chunks)`);
    assert.equal(s.usage.completion_tokens, 8);
  }
  const multi = await streamCompletion(srv.url, { prompt: [P1, P2], max_tokens: 8, temperature: 0 });
  assert.equal(multi.usage, null, "usage only with stream_options.include_usage");
});

test("stop strings: the text ends before the first one, finish_reason stop, streaming too", async () => {
  const full = G.get(P1).decoded_new;  // "Albert min BrittxxinnPET() prayed"
  for (const stop of [" Britt", ["PET", "zzz"], ["xx", " min"]]) {
    const stops = [].concat(stop);
    const cut = Math.min(...stops.map((s) => (full.indexOf(s) < 0 ? Infinity : full.indexOf(s))));
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0, stop });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].text, full.slice(0, cut));
    assert.equal(r.json.choices[0].finish_reason, "stop");
    assert.ok(r.json.usage.completion_tokens < 8, "generation stopped early");
    const s = await streamCompletion(srv.url, { prompt: P1, max_tokens: 8, temperature: 0, stop });
    assert.equal(s.text, full.slice(0, cut));
    assert.equal(s.finish_reason, "stop");
  }
  const none = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0, stop: "qqq" });
  assert.equal(none.json.choices[0].text, full);
});

test("sampling: a seed gives the same text again; temperature > 0 without a seed still works", async () => {
  const body = { prompt: P2, max_tokens: 12, temperature: 0.9, top_p: 0.95, seed: 1234 };
  const a = await postJson(`${srv.url}/v1/completions`, body);
  const b = await postJson(`${srv.url}/v1/completions`, body);
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.choices[0].text, b.json.choices[0].text);
  const s = await streamCompletion(srv.url, body);
  assert.equal(s.text, a.json.choices[0].text);
  const c = await postJson(`${srv.url}/v1/completions`, { prompt: P2, max_tokens: 5, temperature: 1.5, top_k: 40 });
  assert.equal(c.status, 200, c.text);
  assert.equal(c.json.usage.completion_tokens, 5);
});

test("GET /v1/models, GET /health, GET / (the page)", async () => {
  const m = await getJson(`${srv.url}/v1/models`);
  assert.equal(m.json.object, "list");
  assert.equal(m.json.data[0].id, "opt-tiny-realvocab");
  assert.equal(m.json.data[0].max_model_len, 64);
  const h = await getJson(`${srv.url}/health`);
  assert.equal(h.status, 200);
  assert.equal(h.json.status, "ok");
  assert.equal(h.json.max_batch, 4);
  assert.equal(h.json.active, 0);
  assert.ok(h.json.completed > 0);
  const page = await fetch(`${srv.url}/`);
  assert.equal(page.status, 200);
  assert.match(page.headers.get("content-type"), /text\/html/);
  const html = await page.text();
  assert.match(html, /<textarea id="prompt"/);
  assert.match(html, /\/v1\/completions/);
});
