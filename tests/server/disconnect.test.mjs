// A client that goes away mid-stream frees its slot at once (the scheduler calls Batch::stop), whether it was
// running or still waiting; SIGINT/SIGTERM shut the server down cleanly with streams open.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer, postJson, getJson, streamCompletion, sseData, until, sleep, goldens } from "./lib.mjs";

const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is";
const health = async (srv) => (await getJson(`${srv.url}/health`)).json;

// Opens a streaming completion on a raw socket; resolves once `chunks` data events have arrived.
function openStream(srv, body, chunks) {
  return new Promise((resolve, reject) => {
    const s = net.connect(srv.port, "127.0.0.1");
    const payload = JSON.stringify({ ...body, stream: true });
    s.on("connect", () => s.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
                                  `Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`));
    let got = "";
    const timer = setTimeout(() => { s.destroy(); reject(new Error("no stream data in 20 s: " + got)); }, 20000);
    s.on("data", (d) => {
      got += d;
      if ((got.match(/data: \{/g) ?? []).length >= chunks) { clearTimeout(timer); resolve(s); }
    });
    s.on("error", () => {});
  });
}

test("a client that disconnects mid-stream frees its slot at once", async () => {
  // one slot, 40 ms a step: the long stream would hold the slot for 50 * 40 ms = 2 s
  const srv = await startServer(["--max-batch", "1", "--step-delay-ms", "40"]);
  try {
    const sock = await openStream(srv, { prompt: P2, max_tokens: 50, temperature: 0 }, 3);
    let h = await health(srv);
    assert.equal(h.active, 1);
    assert.ok(h.kv_cache_bytes > 0);
    const t0 = Date.now();
    sock.destroy();
    h = await until(async () => { const x = await health(srv); return x.cancelled === 1 && x.active === 0 && x; },
                    1500, "the stream's sequence to be stopped");
    const freedMs = Date.now() - t0;
    assert.equal(h.kv_cache_bytes, 0, "its KV cache is freed");
    assert.ok(h.generated_tokens < 20, `stopped early (${h.generated_tokens} tokens generated of 50)`);
    // the slot is free: a new request runs right away and is correct
    const t1 = Date.now();
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0 });
    assert.equal(r.json.choices[0].text, G.get(P1).decoded_new);
    assert.ok(Date.now() - t1 < 1500, `the next request waited ${Date.now() - t1} ms`);
    assert.ok(freedMs < 1000, `freed after ${freedMs} ms`);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("a client that disconnects while queued never takes a slot", async () => {
  const srv = await startServer(["--max-batch", "1", "--step-delay-ms", "30"]);
  try {
    const running = streamCompletion(srv.url, { prompt: P1, max_tokens: 40, temperature: 0 });
    await until(async () => (await health(srv)).active === 1, 5000, "the first stream to run");
    // the second stream waits behind the first; its client gives up after the headers
    const ac = new AbortController();
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, signal: ac.signal,
      body: JSON.stringify({ prompt: P2, max_tokens: 40, temperature: 0, stream: true }) });
    assert.equal(res.status, 200);
    assert.equal((await health(srv)).queued, 1);
    ac.abort();
    const first = await running;
    assert.equal(first.finish_reason, "length");
    const h = await until(async () => { const x = await health(srv); return x.active === 0 && x.queued === 0 && x; },
                          5000, "the queue to drain");
    assert.equal(h.cancelled, 1, "the queued request was dropped, not run");
    assert.ok(h.generated_tokens < 60, `only the first request ran (${h.generated_tokens} tokens)`);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("many clients disconnecting at random points: no slot leaks, later answers still correct", async () => {
  const srv = await startServer(["--max-batch", "12", "--step-delay-ms", "25"]);
  try {
    // each client hangs up as soon as it has seen 1 to 4 chunks of its 40-token answer
    await Promise.all(Array.from({ length: 12 }, (_, i) =>
      openStream(srv, { prompt: `Story ${i}: once upon a time`, max_tokens: 40, temperature: 0 }, 1 + (i % 4))
        .then((s) => s.destroy())));
    const h = await until(async () => { const x = await health(srv); return x.active === 0 && x.queued === 0 && x; },
                          5000, "every stream to be dropped");
    assert.equal(h.cancelled + h.completed, 12);
    assert.ok(h.cancelled >= 10, `${h.cancelled} cancelled`);
    assert.equal(h.kv_cache_bytes, 0);
    const r = await postJson(`${srv.url}/generate`, { prompts: [P1, P2], max_new_tokens: 8 });
    assert.deepEqual(r.json.texts, [G.get(P1).decoded, G.get(P2).decoded]);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

for (const sig of ["SIGTERM", "SIGINT"]) {
  test(`${sig} with streams open and requests waiting: clean, prompt exit`, async () => {
    const srv = await startServer(["--max-batch", "2", "--step-delay-ms", "50"]);
    const streams = Array.from({ length: 3 }, (_, i) =>
      fetch(`${srv.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ prompt: `${P1} ${i}`, max_tokens: 50, temperature: 0, stream: true }),
        signal: AbortSignal.timeout(20000) }).then(async (r) => (r.status === 200 ? r.text() : `failed: status ${r.status}`)).catch((e) => "failed: " + e));
    const plain = postJson(`${srv.url}/v1/completions`, { prompt: P2, max_tokens: 50, temperature: 0 })
      .catch((e) => ({ status: -1, error: e }));
    await until(async () => (await health(srv)).active === 2, 5000, "two running sequences");
    const t0 = Date.now();
    srv.proc.kill(sig);
    const { code } = await srv.exited;
    assert.equal(code, 0, srv.stderr());
    assert.ok(Date.now() - t0 < 5000, `exit took ${Date.now() - t0} ms`);
    assert.match(srv.stderr(), /shutting down/);
    // every stream, running or waiting, is told: its last events are the shutdown error, then [DONE] (the HTTP
    // workers finish their responses before the server exits)
    for (const body of await Promise.all(streams)) {
      assert.ok(!body.startsWith("failed"), body);
      const data = sseData(body);
      assert.equal(data.at(-1), "[DONE]", body.slice(-200));
      assert.equal(JSON.parse(data.at(-2)).error.message, "server shutting down", body.slice(-200));
    }
    // and the plain request a JSON 503
    const p = await plain;
    assert.equal(p.status, 503, String(p.error ?? p.text));
    assert.equal(p.json.error.message, "server shutting down");
  });
}
