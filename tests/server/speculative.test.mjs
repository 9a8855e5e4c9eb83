// opt-serve with speculative decoding (--lookup N, --draft-self int8): greedy answers are the flag-off server's
// and the goldens, byte for byte, alone or batched; seeded sampling is reproducible alone and in a batch; a request
// opts out with "speculative": false and then gets the flag-off server's sampled text; /health counts proposals.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, getJson, streamCompletion, assertApiError, goldens } from "./lib.mjs";

const G = goldens();
const PROMPTS = [...G.keys()];
const P1 = "Hello, my dog is cute", P2 = "The capital of France is";
let plain, lookup, self8;

before(async () => {
  [plain, lookup, self8] = await Promise.all([
    startServer(["--max-batch", "8"]),
    startServer(["--max-batch", "8", "--lookup", "2", "--draft-tokens", "3"]),
    startServer(["--max-batch", "8", "--draft-self", "int8", "--draft-tokens", "4"]),
  ]);
});
after(async () => {
  for (const s of [plain, lookup, self8]) {
    const r = await s.stop();
    assert.equal(r.code, 0, "clean exit on SIGTERM:\n" + s.stderr());
  }
});

const completion = async (srv, body) => {
  const r = await postJson(`${srv.url}/v1/completions`, body);
  assert.equal(r.status, 200, r.text);
  return r.json.choices.map((c) => [c.text, c.finish_reason]);
};

test("greedy: /generate and /v1/completions equal the goldens and the flag-off server, alone and batched", async () => {
  const want = await postJson(`${plain.url}/generate`, { prompts: PROMPTS, max_new_tokens: 8 });
  assert.equal(want.status, 200, want.text);
  assert.deepEqual(want.json.texts, PROMPTS.map((p) => G.get(p).decoded));
  for (const srv of [lookup, self8]) {
    const all = await postJson(`${srv.url}/generate`, { prompts: PROMPTS, max_new_tokens: 8 });
    assert.deepEqual(all.json, want.json);
    const one = await Promise.all(PROMPTS.map((p) => postJson(`${srv.url}/generate`,
                                                              { prompts: [p], max_new_tokens: 8 })));
    assert.deepEqual(one.map((r) => r.json.texts[0]), want.json.texts);
    // longer than the goldens: the flag-off server's answer, with stop strings and streaming
    for (const body of [{ prompt: PROMPTS, max_tokens: 40, temperature: 0 },
                        { prompt: P1, max_tokens: 40, temperature: 0, stop: [" the"] },
                        { prompt: P2, max_tokens: 30, temperature: 0, repetition_penalty: 1.3 }]) {
      assert.deepEqual(await completion(srv, body), await completion(plain, body));
    }
    const s = await streamCompletion(srv.url, { prompt: P1, max_tokens: 40, temperature: 0 });
    assert.equal(s.text, (await completion(plain, { prompt: P1, max_tokens: 40, temperature: 0 }))[0][0]);
  }
});

test("sampling: a seed gives the same text again, alone or among others; \"speculative\": false is plain", async () => {
  const body = { prompt: P2, max_tokens: 24, temperature: 0.9, top_k: 40, seed: 77 };
  for (const srv of [lookup, self8]) {
    const a = await completion(srv, body);
    const crowd = await Promise.all([body, ...PROMPTS.map((p, i) => ({ ...body, prompt: p, seed: i }))]
                                      .map((b) => completion(srv, b)));
    assert.deepEqual(crowd[0], a);
    const s = await streamCompletion(srv.url, body);
    assert.equal(s.text, a[0][0]);
    const off = { ...body, speculative: false };
    assert.deepEqual(await completion(srv, off), await completion(plain, body));
    const g = await postJson(`${srv.url}/generate`, { prompts: [P1], max_new_tokens: 8, speculative: false });
    assert.deepEqual(g.json.texts, [G.get(P1).decoded]);
  }
});

test("/health reports the drafter's proposals; a bad \"speculative\" is a 400", async () => {
  for (const srv of [lookup, self8]) {
    const h = await getJson(`${srv.url}/health`);
    assert.equal(typeof h.json.speculative.drafter, "string");
    assert.ok(h.json.speculative.proposed > 0, JSON.stringify(h.json));
    assert.ok(h.json.speculative.accepted <= h.json.speculative.proposed);
    const m = await (await fetch(`${srv.url}/metrics`)).text();
    const proposed = Number(/^opt_serve_draft_tokens_proposed_total (\S+)$/m.exec(m)?.[1]);
    assert.ok(proposed >= h.json.speculative.proposed, m);
    assert.match(m, /^opt_serve_draft_tokens_accepted_total \d+$/m);
    assertApiError(await postJson(`${srv.url}/v1/completions`, { prompt: P1, speculative: "no" }), 400, "speculative");
    assertApiError(await postJson(`${srv.url}/generate`, { prompts: [P1], speculative: 1 }), 400, "speculative");
  }
  const h = await getJson(`${plain.url}/health`);
  assert.equal(h.json.speculative, undefined);  // the flag-off /health is unchanged
  assert.doesNotMatch(await (await fetch(`${plain.url}/metrics`)).text(), /draft_tokens/);
});
