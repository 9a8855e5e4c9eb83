// /v1/completions beyond the basics: logprobs (OpenAI's legacy shape) checked against the fixtures' goldens
// (log_softmax of Hugging Face's logits, within 1e-4), echo with the prompt's logprobs, n > 1, presence and
// frequency penalties, logit_bias, and the same through the openai client, streamed and not.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { startServer, postJson, sseData, SHARED, MODEL, CI } from "./lib.mjs";

const HAVE = existsSync(new URL("./node_modules/openai/package.json", import.meta.url));
const skipClient = !HAVE && !CI ? "npm ci --prefix tests/server has not been run" : false;
const PRELN = path.join(SHARED, "fixtures", "opt-tiny-preln");
const TOL = 1e-4;

// A fixture's goldens.json and a float32 array it describes.
const load = (dir) => JSON.parse(readFileSync(path.join(dir, "goldens.json"), "utf8"));
function f32(dir, desc) {
  const b = readFileSync(path.join(dir, desc.file));
  return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
}
// log_softmax of row r (length V) of a flat array, in double
function logSoftmax(a, r, V) {
  const row = Array.from(a.subarray(r * V, (r + 1) * V));
  const mx = Math.max(...row);
  let sum = 0;
  for (const x of row) sum += Math.exp(x - mx);
  const lse = mx + Math.log(sum);
  return row.map((x) => x - lse);
}
const close = (a, b, what) => assert.ok(Math.abs(a - b) <= TOL, `${what}: ${a} vs ${b}`);
// the top_logprobs values, largest first
const topValues = (d) => Object.values(d).sort((a, b) => b - a);
// a reference row's n largest values
const largest = (ls, n) => [...ls].sort((a, b) => b - a).slice(0, n);
function checkTop(dict, ls, n, what) {
  const got = topValues(dict), want = largest(ls, n);
  assert.ok(got.length >= n && got.length <= n + 1, `${what}: ${got.length} entries`);
  for (let k = 0; k < n; k++) close(got[k], want[k], `${what} top ${k}`);
}

let rv, pre;  // servers: the real-vocabulary fixture, and opt-tiny-preln (V = 512, per-step golden scores)
const RV = load(MODEL), PRE = load(PRELN);
const rvSingle = RV.cases.find((c) => c.name === "single");
const preSingle = PRE.cases.find((c) => c.name === "single");

before(async () => {
  rv = await startServer(["--max-prompts", "8"]);
  pre = await startServer([], { model: PRELN });
});
after(async () => {
  for (const s of [rv, pre]) if (s) assert.equal((await s.stop()).code, 0, s.stderr());
});

test("echo + logprobs: the prompt's log-probabilities are log_softmax of the golden logits", async () => {
  const prompt = rvSingle.prompts[0], V = RV.config.vocab_size;
  const logits = f32(MODEL, rvSingle.logits);  // [1, T, V]
  const r = await postJson(`${rv.url}/v1/completions`, { prompt: rvSingle.texts[0], max_tokens: 1, temperature: 0,
                                                          echo: true, logprobs: 5 });
  assert.equal(r.status, 200, r.text);
  const c = r.json.choices[0], lp = c.logprobs;
  assert.deepEqual(Object.keys(lp).sort(), ["text_offset", "token_logprobs", "tokens", "top_logprobs"]);
  assert.equal(lp.tokens.length, prompt.length + 1);
  assert.equal(lp.token_logprobs[0], null);  // the first prompt token has none, as OpenAI and vLLM
  assert.equal(lp.top_logprobs[0], null);
  assert.equal(lp.tokens[0], "</s>");
  for (let i = 1; i <= prompt.length; i++) {
    const ls = logSoftmax(logits, i - 1, V);
    const tok = i < prompt.length ? prompt[i] : rvSingle.generate.new_tokens[0][0];
    close(lp.token_logprobs[i], ls[tok], `position ${i}`);
    checkTop(lp.top_logprobs[i], ls, 5, `position ${i}`);
    assert.ok(lp.tokens[i] in lp.top_logprobs[i], "the chosen token is always in top_logprobs");
  }
  // text_offset: where each token's text starts in the choice's text (echoed prompt + completion)
  assert.ok(c.text.startsWith(rvSingle.texts[0]));
  assert.equal(lp.text_offset[0], 0);
  for (let i = 1; i < lp.tokens.length; i++) {
    assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    assert.ok(c.text.slice(lp.text_offset[i]).startsWith(lp.tokens[i]), `token ${i} ${JSON.stringify(lp.tokens[i])}`);
  }
  assert.equal(r.json.usage.completion_tokens, 1);
  // streamed: the echo's event carries the prompt's logprobs, then one event per token; the same numbers
  const res = await fetch(`${rv.url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: rvSingle.texts[0], max_tokens: 1, temperature: 0, echo: true, logprobs: 5,
                           stream: true }) });
  const chunks = sseData(await res.text()).filter((d) => d !== "[DONE]").map((d) => JSON.parse(d).choices[0]);
  assert.equal(chunks[0].text, rvSingle.texts[0]);
  assert.equal(chunks[0].logprobs.tokens.length, prompt.length);
  const got = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const ch of chunks) for (const k of Object.keys(got)) got[k].push(...ch.logprobs[k]);
  assert.deepEqual(got, lp);
  assert.equal(chunks.map((ch) => ch.text).join(""), c.text);
});

test("logprobs of every greedy step are log_softmax of the golden scores; streamed, each chunk its token", async () => {
  const prompt = preSingle.prompts[0], want = preSingle.generate.new_tokens[0], V = PRE.config.vocab_size;
  const scores = f32(PRELN, preSingle.generate.scores);  // [steps, 1, V]
  const body = { prompt, max_tokens: want.length, temperature: 0, logprobs: 3 };
  const r = await postJson(`${pre.url}/v1/completions`, body);
  assert.equal(r.status, 200, r.text);
  const lp = r.json.choices[0].logprobs;
  assert.equal(lp.tokens.length, want.length);
  for (let k = 0; k < want.length; k++) {
    const ls = logSoftmax(scores, k, V);
    close(lp.token_logprobs[k], ls[want[k]], `step ${k}`);
    checkTop(lp.top_logprobs[k], ls, 3, `step ${k}`);
  }
  // the tokens are the greedy goldens: detokenized one by one they are the completion
  const text = (await postJson(`${pre.url}/detokenize`, { tokens: want })).json.prompt;
  assert.equal(r.json.choices[0].text, text);
  assert.equal(lp.tokens.join(""), text);
  // streamed: one token per chunk, the same numbers
  const res = await fetch(`${pre.url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  const chunks = sseData(await res.text()).filter((d) => d !== "[DONE]").map((d) => JSON.parse(d));
  const got = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let streamed = "";
  for (const ch of chunks) {
    const l = ch.choices[0].logprobs;
    assert.ok(l.tokens.length <= 1, "at most one token per chunk");
    for (const k of Object.keys(got)) got[k].push(...l[k]);
    streamed += ch.choices[0].text;
  }
  assert.deepEqual(got, lp);
  assert.equal(streamed, text);
  assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
});

test("logprobs are the raw model's, before logit_bias and penalties; the options change the tokens", async () => {
  const prompt = preSingle.prompts[0], want = preSingle.generate.new_tokens[0], V = PRE.config.vocab_size;
  const scores = f32(PRELN, preSingle.generate.scores);
  const ls0 = logSoftmax(scores, 0, V);
  // a bias of 100 forces a token the model finds unlikely
  const forced = ls0.indexOf(Math.min(...ls0));
  const biased = await postJson(`${pre.url}/v1/completions`, { prompt, max_tokens: 4, temperature: 0, logprobs: 1,
                                                               logit_bias: { [forced]: 100 } });
  assert.equal(biased.status, 200, biased.text);
  const forcedText = (await postJson(`${pre.url}/detokenize`, { tokens: [forced] })).json.prompt;
  assert.deepEqual(biased.json.choices[0].logprobs.tokens, Array(4).fill(forcedText));
  close(biased.json.choices[0].logprobs.token_logprobs[0], ls0[forced], "the forced token's raw logprob");
  // greedy with a presence penalty: the golden's repeated first token is not chosen again
  assert.equal(want[0], want[1]);
  const plain = await postJson(`${pre.url}/v1/completions`, { prompt, max_tokens: 8, temperature: 0 });
  for (const penalty of [{ presence_penalty: 2 }, { frequency_penalty: 2 }]) {
    const p = await postJson(`${pre.url}/v1/completions`, { prompt, max_tokens: 8, temperature: 0, logprobs: 0,
                                                            ...penalty });
    assert.equal(p.status, 200, p.text);
    const l = p.json.choices[0].logprobs;
    assert.notEqual(p.json.choices[0].text, plain.json.choices[0].text, JSON.stringify(penalty));
    close(l.token_logprobs[0], ls0[want[0]], "step 0 is unpenalized");
    assert.equal(Object.keys(l.top_logprobs[0]).length, 1, "logprobs: 0 gives the chosen token only");
  }
  // a negative presence penalty, in range, is accepted; out of range is a 400 naming it
  assert.equal((await postJson(`${pre.url}/v1/completions`, { prompt, max_tokens: 2, presence_penalty: -2 })).status,
               200);
  for (const [bad, param] of [[{ presence_penalty: 2.5 }, "presence_penalty"],
                              [{ frequency_penalty: -3 }, "frequency_penalty"],
                              [{ logit_bias: { 512: 1 } }, "logit_bias"], [{ logit_bias: { "-1": 1 } }, "logit_bias"],
                              [{ logit_bias: { x: 1 } }, "logit_bias"], [{ logit_bias: { 5: 101 } }, "logit_bias"],
                              [{ logit_bias: { 5: "1" } }, "logit_bias"], [{ logit_bias: [1] }, "logit_bias"],
                              [{ logprobs: 21 }, "logprobs"], [{ logprobs: -1 }, "logprobs"],
                              [{ logprobs: true }, "logprobs"], [{ n: 0 }, "n"]]) {
    const e = await postJson(`${pre.url}/v1/completions`, { prompt, ...bad });
    assert.equal(e.status, 400, JSON.stringify(bad));
    assert.equal(e.json.error.param, param, JSON.stringify(bad));
  }
});

test("n > 1: greedy gives n equal choices; seeded choice i is the seed + i's answer; usage counts every choice",
     async () => {
  const P = rvSingle.texts[0];
  const g = await postJson(`${rv.url}/v1/completions`, { prompt: P, n: 3, max_tokens: 8, temperature: 0 });
  assert.equal(g.status, 200, g.text);
  assert.deepEqual(g.json.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of g.json.choices) assert.equal(c.text, rvSingle.generate.decoded_new[0]);
  assert.deepEqual(g.json.usage, { prompt_tokens: 7, completion_tokens: 24, total_tokens: 31 });
  // two prompts, n = 2: prompt 0's choices, then prompt 1's
  const batch = RV.cases.find((c) => c.name === "batch_left");
  const two = await postJson(`${rv.url}/v1/completions`, { prompt: batch.texts, n: 2, max_tokens: 8,
                                                           temperature: 0 });
  assert.deepEqual(two.json.choices.map((c) => c.text),
                   [0, 0, 1, 1].map((i) => batch.generate.alone[i].decoded_new));
  assert.equal(two.json.usage.prompt_tokens, batch.prompts[0].length + batch.prompts[1].length);
  // sampling with a seed: reproducible, choice i as n = 1 with seed + i, and not all alike
  const body = { prompt: P, max_tokens: 12, temperature: 1.5, seed: 41 };
  const a = await postJson(`${rv.url}/v1/completions`, { ...body, n: 4 });
  const b = await postJson(`${rv.url}/v1/completions`, { ...body, n: 4 });
  assert.deepEqual(a.json.choices, b.json.choices);
  for (let i = 0; i < 4; i++) {
    const one = await postJson(`${rv.url}/v1/completions`, { ...body, seed: 41 + i });
    assert.equal(a.json.choices[i].text, one.json.choices[0].text, `choice ${i}`);
  }
  assert.ok(new Set(a.json.choices.map((c) => c.text)).size > 1, "seeded choices differ");
  // streamed, each choice its own index, the same texts
  const res = await fetch(`${rv.url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, n: 4, stream: true }) });
  const texts = ["", "", "", ""];
  for (const d of sseData(await res.text()))
    if (d !== "[DONE]") for (const c of JSON.parse(d).choices) texts[c.index] += c.text;
  assert.deepEqual(texts, a.json.choices.map((c) => c.text));
  // n choices count against --max-prompts 8
  const big = await postJson(`${rv.url}/v1/completions`, { prompt: [P, P, P], n: 3 });
  assert.equal(big.status, 400);
  assert.equal(big.json.error.param, "n");
  assert.match(big.json.error.message, /9 choices; at most 8/);
});

test("stop as a string or a list, with logprobs: the text ends before it", async () => {
  const P = rvSingle.texts[0], full = rvSingle.generate.decoded_new[0];
  const cut = full.indexOf("inn");
  assert.ok(cut > 0);
  for (const stop of ["inn", ["zzz", "inn"]]) {
    const r = await postJson(`${rv.url}/v1/completions`, { prompt: P, max_tokens: 8, temperature: 0, stop,
                                                            logprobs: 1 });
    assert.equal(r.json.choices[0].text, full.slice(0, cut), JSON.stringify(stop));
    assert.equal(r.json.choices[0].finish_reason, "stop");
    const lp = r.json.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.json.usage.completion_tokens, "one entry per generated token");
  }
});

test("the openai client: logprobs and n round-trip, streamed and not", { skip: skipClient }, async () => {
  const OpenAI = (await import("openai")).default;
  const client = new OpenAI({ baseURL: `${rv.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 });
  const P = rvSingle.texts[0];
  const r = await client.completions.create({ model: "m", prompt: P, max_tokens: 8, temperature: 0, n: 2,
                                              logprobs: 2, echo: true });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.text, P + rvSingle.generate.decoded_new[0]);
    assert.equal(c.logprobs.tokens.length, 7 + 8);
    assert.equal(c.logprobs.token_logprobs[0], null);
    assert.equal(c.logprobs.text_offset.length, 15);
  }
  assert.deepEqual(r.choices[0].logprobs, r.choices[1].logprobs);
  assert.equal(r.usage.completion_tokens, 16);
  const stream = await client.completions.create({ model: "m", prompt: P, max_tokens: 8, temperature: 0, n: 2,
                                                   logprobs: 2, stream: true,
                                                   stream_options: { include_usage: true } });
  const per = [[], []], text = ["", ""];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      per[c.index].push(...c.logprobs.token_logprobs);
      text[c.index] += c.text;
    }
  }
  for (let i = 0; i < 2; i++) {
    assert.equal(text[i], rvSingle.generate.decoded_new[0]);
    assert.deepEqual(per[i], r.choices[i].logprobs.token_logprobs.slice(7));
  }
  assert.equal(usage.completion_tokens, 16);
  assert.equal(usage.prompt_tokens, 7);
});
