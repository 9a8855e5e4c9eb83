// The real OpenAI Node client (npm "openai") driving /v1/completions, with and without streaming.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { startServer, goldens, until, CI } from "./lib.mjs";

const HAVE = existsSync(new URL("./node_modules/openai/package.json", import.meta.url));
const skip = !HAVE && !CI ? "npm ci --prefix tests/server has not been run" : false;
const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is", P3 = "Once upon a time";
let srv, client, OpenAI;

before(async () => {
  if (skip) return;
  assert.ok(HAVE, "tests/server/node_modules/openai is missing: run `npm ci --prefix tests/server`");
  OpenAI = (await import("openai")).default;
  srv = await startServer();
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 });
});
after(async () => {
  if (srv) assert.equal((await srv.stop()).code, 0, srv.stderr());
});

test("models.list", { skip }, async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, "opt-tiny-realvocab");
});

test("completions.create without streaming", { skip }, async () => {
  const r = await client.completions.create({ model: "opt-tiny-realvocab", prompt: P1, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0].text, G.get(P1).decoded_new);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.prompt_tokens, G.get(P1).prompt_ids.length);
  const many = await client.completions.create({ model: "opt-tiny-realvocab", prompt: [P1, P2, P3], max_tokens: 8,
                                                 temperature: 0 });
  assert.deepEqual(many.choices.map((c) => c.text), [P1, P2, P3].map((p) => G.get(p).decoded_new));
  const stopped = await client.completions.create({ model: "x", prompt: P1, max_tokens: 8, temperature: 0,
                                                    stop: ["inn"] });
  assert.equal(stopped.choices[0].text, "Albert min Brittxx");
  assert.equal(stopped.choices[0].finish_reason, "stop");
});

test("completions.create with stream: true", { skip }, async () => {
  for (const p of [P1, P2, P3]) {
    const stream = await client.completions.create({ model: "opt-tiny-realvocab", prompt: p, max_tokens: 8,
                                                     temperature: 0, stream: true,
                                                     stream_options: { include_usage: true } });
    let text = "", finish = null, chunks = 0, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        chunks++;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, G.get(p).decoded_new);
    assert.equal(finish, "length");
    assert.ok(chunks > 1);
    assert.equal(usage.completion_tokens, 8);
  }
});

test("a stream the client breaks off frees its sequence on the server", { skip }, async () => {
  const before = (await (await fetch(`${srv.url}/health`)).json()).cancelled;
  const stream = await client.completions.create({ model: "m", prompt: P2, max_tokens: 50, temperature: 0,
                                                   stream: true });
  let n = 0;
  for await (const chunk of stream) {
    void chunk;
    if (++n === 2) break;  // the SDK aborts the HTTP request
  }
  await until(async () => {
    const h = await (await fetch(`${srv.url}/health`)).json();
    return h.active === 0 && (h.cancelled > before || h.completed > 0);
  }, 5000, "the sequence to leave the batch");
  const again = await client.completions.create({ model: "m", prompt: P1, max_tokens: 8, temperature: 0 });
  assert.equal(again.choices[0].text, G.get(P1).decoded_new);
});

test("errors reach the client as typed API errors", { skip }, async () => {
  await assert.rejects(client.completions.create({ model: "m", prompt: P1, n: 100 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.constructor.name, "BadRequestError");
    assert.match(e.message, /out of range \[1, 32\]/);
    assert.equal(e.param, "n");
    return true;
  });
  await assert.rejects(client.completions.create({ model: "m", prompt: P1, max_tokens: 1000000 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, "max_tokens");
    return true;
  });
  await assert.rejects(client.completions.create({ model: "m", prompt: P1, temperature: -1, stream: true }),
                       (e) => e.status === 400 && e.param === "temperature");
});
