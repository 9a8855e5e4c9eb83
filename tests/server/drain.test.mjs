// --drain-timeout: SIGTERM (or SIGINT) refuses new work with 503 and /health answers 503 "draining", while the
// streams and requests already running or waiting run to their end and get their full answers; then exit 0.
// A drain cut short by the timeout ends the rest with the shutdown error and exits 1.
import { test } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJson, streamCompletion, sseData, until } from "./lib.mjs";

const P = "The quick brown fox";
const health = async (srv) => {
  const r = await fetch(`${srv.url}/health`, { signal: AbortSignal.timeout(5000) });
  return { status: r.status, json: await r.json() };
};

for (const sig of ["SIGTERM", "SIGINT"]) {
  test(`${sig} with --drain-timeout: running and waiting requests finish, new ones get 503, exit 0`, async () => {
    // the answers alone, from a server of its own
    const ref = await startServer();
    const want = [];
    for (let i = 0; i < 3; i++)
      want.push((await postJson(`${ref.url}/v1/completions`, { prompt: `${P} ${i}`, max_tokens: 40,
                                                               temperature: 0 })).json.choices[0].text);
    assert.equal((await ref.stop()).code, 0);

    // two running (--max-batch 2), one streaming and one plain request waiting
    const srv = await startServer(["--max-batch", "2", "--step-delay-ms", "20", "--drain-timeout", "30"]);
    const body = (i) => ({ prompt: `${P} ${i}`, max_tokens: 40, temperature: 0 });
    const streams = [0, 1].map((i) => streamCompletion(srv.url, body(i), { timeoutMs: 30000 }));
    await until(async () => (await health(srv)).json.active === 2, 5000, "two running sequences");
    const plain = postJson(`${srv.url}/v1/completions`, body(2), { timeoutMs: 30000 });
    await until(async () => (await health(srv)).json.queued === 1, 5000, "a waiting sequence");
    srv.proc.kill(sig);
    await until(async () => (await health(srv)).status === 503, 5000, "/health 503");
    const h = await health(srv);
    assert.equal(h.json.status, "draining");
    // new work: 503 with the shutdown error, the connection closed
    const refused = await postJson(`${srv.url}/generate`, { prompts: [P], max_new_tokens: 2 });
    assert.equal(refused.status, 503, refused.text);
    assert.equal(refused.json.error.code, "shutting_down");
    assert.equal(refused.headers.get("connection"), "close");
    const s = await Promise.all(streams);
    s.forEach((r, i) => {
      assert.ok(r.done);
      assert.equal(r.text, want[i]);
      assert.equal(r.finish_reason, "length");
    });
    const p = await plain;
    assert.equal(p.status, 200, p.text);
    assert.equal(p.json.choices[0].text, want[2]);
    const { code } = await srv.exited;
    assert.equal(code, 0, srv.stderr());
    assert.match(srv.stderr(), /draining[\s\S]*drained/);
  });
}

test("a drain past --drain-timeout: what is left ends with the shutdown error, exit 1", async () => {
  const srv = await startServer(["--step-delay-ms", "100", "--drain-timeout", "1"]);
  const res = fetch(`${srv.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: P, max_tokens: 50, temperature: 0, stream: true }),
    signal: AbortSignal.timeout(20000) }).then((r) => r.text());
  await until(async () => (await health(srv)).json.active === 1, 5000, "a running sequence");
  const t0 = Date.now();
  srv.proc.kill("SIGTERM");
  const { code } = await srv.exited;
  assert.equal(code, 1, srv.stderr());
  assert.ok(Date.now() - t0 < 5000, `exit took ${Date.now() - t0} ms`);
  assert.match(srv.stderr(), /drain cut short \(--drain-timeout\): 1 sequences/);
  const data = sseData(await res);
  assert.equal(data.at(-1), "[DONE]");
  assert.equal(JSON.parse(data.at(-2)).error.message, "server shutting down");
});

test("a second signal cuts a drain short", async () => {
  const srv = await startServer(["--step-delay-ms", "100", "--drain-timeout", "60"]);
  const res = fetch(`${srv.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: P, max_tokens: 50, temperature: 0, stream: true }),
    signal: AbortSignal.timeout(20000) }).then((r) => r.text());
  await until(async () => (await health(srv)).json.active === 1, 5000, "a running sequence");
  srv.proc.kill("SIGTERM");
  await until(async () => (await health(srv)).status === 503, 5000, "/health 503");
  const t0 = Date.now();
  srv.proc.kill("SIGTERM");
  const { code } = await srv.exited;
  assert.equal(code, 1, srv.stderr());
  assert.ok(Date.now() - t0 < 4000, `exit took ${Date.now() - t0} ms`);
  assert.match(srv.stderr(), /drain cut short \(a second signal\)/);
  assert.equal(JSON.parse(sseData(await res).at(-2)).error.message, "server shutting down");
});
