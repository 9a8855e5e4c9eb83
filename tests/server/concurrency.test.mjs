// Continuous batching: 40 simultaneous clients with different prompts, lengths, budgets, endpoints, streaming or
// not, greedy or seeded sampling. Each answer must equal what the same request gets alone, and every request whose
// prompt has a Hugging Face golden (each golden prompt once per greedy endpoint) must equal the golden.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, getJson, streamCompletion, manyPrompts, goldens, sleep } from "./lib.mjs";

let srv;
const G = goldens();

before(async () => { srv = await startServer(["--max-batch", "16", "--max-queue", "64", "--step-delay-ms", "2"]); });
after(async () => { assert.equal((await srv.stop()).code, 0, srv.stderr()); });

// Request i of the mix: its kind and body.
function job(i, prompt) {
  const max_tokens = 4 + ((i * 7) % 27);
  const kind = ["complete", "stream", "generate", "sample", "sample-stream"][i % 5];
  const body = { prompt, max_tokens, temperature: 0 };
  if (kind.startsWith("sample")) Object.assign(body, { temperature: 0.8, top_p: 0.9, seed: 1000 + i });
  if (i % 7 === 3) body.stop = ["e", "Z"];  // stop strings end some sequences early
  return { kind, body };
}

async function run({ kind, body }) {
  if (kind === "generate") {
    const r = await postJson(`${srv.url}/generate`, { prompts: [body.prompt], max_new_tokens: body.max_tokens });
    assert.equal(r.status, 200, r.text);
    return { text: r.json.texts[0] };
  }
  if (kind.endsWith("stream")) {
    const s = await streamCompletion(srv.url, body);
    assert.ok(s.done);
    return { text: s.text, finish: s.finish_reason };
  }
  const r = await postJson(`${srv.url}/v1/completions`, body);
  assert.equal(r.status, 200, r.text);
  return { text: r.json.choices[0].text, finish: r.json.choices[0].finish_reason };
}

test("40 simultaneous clients: every answer equals its request run alone, and the goldens", async () => {
  const jobs = manyPrompts(31).map((p, i) => job(i, p));
  // the golden prompts (greedy, 8 tokens) on each greedy endpoint: 9 requests checked against Hugging Face
  for (const [prompt, golden] of G)
    for (const kind of ["complete", "stream", "generate"])
      jobs.push({ kind, body: { prompt, max_tokens: golden.max_new_tokens, temperature: 0 }, golden });
  assert.equal(jobs.length, 40);
  // alone: one request at a time
  const alone = [];
  for (const j of jobs) alone.push(await run(j));
  const h0 = (await getJson(`${srv.url}/health`)).json;
  // together
  const together = await Promise.all(jobs.map((j) => run(j)));
  // the scheduler retires a sequence right after sending its last bytes: give its bookkeeping a moment
  let h1 = (await getJson(`${srv.url}/health`)).json;
  for (let i = 0; i < 50 && (h1.active !== 0 || h1.kv_cache_bytes !== 0); i++) {
    await new Promise((r) => setTimeout(r, 100));
    h1 = (await getJson(`${srv.url}/health`)).json;
  }
  for (let i = 0; i < jobs.length; i++)
    assert.deepEqual(together[i], alone[i], `request ${i} (${jobs[i].kind}, ${JSON.stringify(jobs[i].body)})`);
  // every golden request matches Hugging Face exactly: /generate returns prompt + continuation, the others the
  // continuation
  let checked = 0;
  jobs.forEach((j, i) => {
    if (!j.golden) return;
    const want = j.kind === "generate" ? j.golden.decoded : j.golden.decoded_new;
    assert.equal(together[i].text, want, `request ${i} (${j.kind}, ${JSON.stringify(j.body)})`);
    if (j.kind !== "generate") assert.equal(together[i].finish, "length", `request ${i}`);
    checked++;
  });
  assert.equal(checked, 3 * G.size);
  // continuous batching really happened: far fewer steps than tokens
  const steps = h1.steps - h0.steps, tokens = h1.generated_tokens - h0.generated_tokens;
  assert.ok(tokens > 0);
  assert.ok(steps * 3 < tokens, `${steps} steps for ${tokens} tokens: sequences did not share steps`);
  assert.equal(h1.active, 0);
  assert.equal(h1.queued, 0);
  assert.equal(h1.kv_cache_bytes, 0, "every KV cache is freed");
});

test("a request joining a running batch changes neither answer", async () => {
  const a = { prompt: "The old lighthouse keeper said", max_tokens: 40, temperature: 0 };
  const b = { prompt: "Hello, my dog is cute", max_tokens: 8, temperature: 0 };
  const aloneA = (await postJson(`${srv.url}/v1/completions`, a)).json.choices[0].text;
  const aloneB = (await postJson(`${srv.url}/v1/completions`, b)).json.choices[0].text;
  const pa = streamCompletion(srv.url, a);
  await sleep(30);  // A is running when B arrives
  const rb = await postJson(`${srv.url}/v1/completions`, b);
  const ra = await pa;
  assert.equal(ra.text, aloneA);
  assert.equal(rb.json.choices[0].text, aloneB);
  assert.equal(aloneB, G.get(b.prompt).decoded_new);
});

test("one /generate request with many prompts equals each prompt alone", async () => {
  const prompts = manyPrompts(24);
  const r = await postJson(`${srv.url}/generate`, { prompts, max_new_tokens: 12 });
  assert.equal(r.status, 200, r.text);
  for (let i = 0; i < prompts.length; i += 5) {
    const one = await postJson(`${srv.url}/generate`, { prompts: [prompts[i]], max_new_tokens: 12 });
    assert.equal(r.json.texts[i], one.json.texts[0]);
  }
});
