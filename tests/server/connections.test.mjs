// Connections: 2,000 slow clients held while a real client's request is answered in normal time; beyond
// --max-connections a fast refusal; the head and body deadlines close a slow client; keep-alive (persistent
// HTTP/1.1, "Connection: close" honoured); a non-streaming request whose client disconnects frees its slot.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { fork } from "node:child_process";
import { startServer, postJson, getJson, until, goldens, sleep } from "./lib.mjs";

const G = goldens();
const P1 = "Hello, my dog is cute", P2 = "The capital of France is";
const health = async (srv) => (await getJson(`${srv.url}/health`)).json;

// A child process holding `n` slowloris connections (slow_clients.mjs); resolves once all are connected.
function slowClients(port, n, everyMs) {
  const child = fork(new URL("./slow_clients.mjs", import.meta.url), [String(port), String(n), String(everyMs)]);
  const next = () => new Promise((resolve, reject) => {
    child.once("message", resolve);
    child.once("exit", (code) => reject(new Error(`slow_clients exited (${code})`)));
  });
  const ready = next();
  return {
    ready,
    async count() { const m = next(); child.send("count"); return m; },
    async stop() { const m = next(); child.send("stop"); await m; },
    kill() { child.kill(); },
  };
}

// A raw socket: resolves {data, closedAfterMs} once the server closes it (or `ms` pass: closedAfterMs = null).
function rawSocket(port, writes, ms) {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    const t0 = Date.now();
    let data = "", done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ data, closedAfterMs: closed ? Date.now() - t0 : null });
    };
    const timer = setTimeout(() => finish(false), ms);
    s.on("connect", async () => {
      for (const w of writes) {
        if (done) return;
        if (typeof w === "number") await sleep(w);
        else s.write(w);
      }
    });
    s.on("data", (d) => { data += d; });
    s.on("error", () => finish(true));
    s.on("close", () => finish(true));
  });
}

test("2,000 slowloris connections held; a real client's /generate is answered within a few seconds", async () => {
  const srv = await startServer(["--head-timeout", "120"]);
  const groups = [];
  try {
    // four processes of 500 connections: under any test runner's file limit
    for (let i = 0; i < 4; i++) groups.push(slowClients(srv.port, 500, 1000));
    await Promise.all(groups.map((g) => g.ready));
    await until(async () => (await health(srv)) && true, 2000, "health");
    const t0 = Date.now();
    const r = await postJson(`${srv.url}/generate`, { prompts: [P1], max_new_tokens: 8 }, { timeoutMs: 20000 });
    const ms = Date.now() - t0;
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json.texts, [G.get(P1).decoded]);
    assert.ok(ms < 3000, `/generate took ${ms} ms with 2,000 slow connections open`);
    // and the slow clients are all still connected (none refused, none dropped)
    await sleep(1500);
    const counts = await Promise.all(groups.map((g) => g.count()));
    assert.equal(counts.reduce((a, c) => a + c.closed, 0), 0, JSON.stringify(counts));
    const m = await (await fetch(`${srv.url}/metrics`)).text();
    const open = Number(m.match(/^opt_serve_connections (\d+)/m)[1]);
    assert.ok(open >= 2000, `${open} connections open`);
  } finally {
    await Promise.all(groups.map((g) => g.stop().catch(() => g.kill())));
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("beyond --max-connections: a fast 503 with a JSON error, and room again once connections close", async () => {
  const srv = await startServer(["--max-connections", "20"]);
  const idle = [];
  try {
    for (let i = 0; i < 20; i++)
      idle.push(await new Promise((resolve) => { const s = net.connect(srv.port, "127.0.0.1", () => resolve(s)); }));
    await sleep(200);
    const t0 = Date.now();
    const r = await rawSocket(srv.port, ["GET /health HTTP/1.1\r\nHost: x\r\n\r\n"], 5000);
    const ms = Date.now() - t0;
    assert.notEqual(r.closedAfterMs, null, "the refused connection is closed");
    assert.ok(ms < 1500, `refused after ${ms} ms`);
    assert.match(r.data, /^HTTP\/1\.1 503/);
    const body = JSON.parse(r.data.slice(r.data.indexOf("\r\n\r\n") + 4));
    assert.equal(body.error.code, "too_many_connections");
    for (const s of idle) s.destroy();
    const h = await until(async () => { try { return await health(srv); } catch { return null; } }, 3000, "room");
    assert.equal(h.status, "ok");
  } finally {
    for (const s of idle) s.destroy();
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("the head and body deadlines close a slow client", async () => {
  const srv = await startServer(["--head-timeout", "1", "--body-timeout", "2"]);
  try {
    // half a request line, then a byte every 300 ms: closed at the 1 s head deadline
    const head = rawSocket(srv.port, ["POST /gen", 300, "e", 300, "r", 300, "a", 300, "t", 300, "e", 300, " ",
                                      300, "H", 300, "T", 300, "T", 300, "P"], 6000);
    // a whole head, then half the body: closed at the 2 s body deadline
    const body = rawSocket(srv.port, ["POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"], 6000);
    // an idle keep-alive connection after one answer: closed at the head deadline too
    const idle = rawSocket(srv.port, ["GET /health HTTP/1.1\r\nHost: x\r\n\r\n"], 6000);
    const [h, b, i] = await Promise.all([head, body, idle]);
    assert.ok(h.closedAfterMs !== null && h.closedAfterMs >= 800 && h.closedAfterMs < 3000, `head: ${h.closedAfterMs}`);
    assert.equal(h.data, "");
    assert.ok(b.closedAfterMs !== null && b.closedAfterMs >= 1800 && b.closedAfterMs < 4000,
              `body: ${b.closedAfterMs}`);
    assert.ok(i.closedAfterMs !== null && i.closedAfterMs >= 800 && i.closedAfterMs < 3000, `idle: ${i.closedAfterMs}`);
    assert.match(i.data, /^HTTP\/1\.1 200/);
    const r = await postJson(`${srv.url}/generate`, { prompts: [P1], max_new_tokens: 8 });
    assert.deepEqual(r.json.texts, [G.get(P1).decoded]);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("keep-alive: several requests on one connection, pipelined too; Connection: close is honoured", async () => {
  const srv = await startServer();
  try {
    const body = JSON.stringify({ prompts: [P1], max_new_tokens: 8 });
    const req = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                `Content-Length: ${body.length}\r\n\r\n${body}`;
    const last = req.replace("Host: x\r\n", "Host: x\r\nConnection: close\r\n");
    // two requests written at once, then a third after the answers, the last asking to close
    const r = await rawSocket(srv.port, [req + req, 1500, last], 8000);
    assert.notEqual(r.closedAfterMs, null, "the server closed after Connection: close");
    const answers = r.data.split(/(?=HTTP\/1\.1 )/);
    assert.equal(answers.length, 3, r.data);
    for (const a of answers) {
      assert.match(a, /^HTTP\/1\.1 200/);
      assert.deepEqual(JSON.parse(a.slice(a.indexOf("\r\n\r\n") + 4)).texts, [G.get(P1).decoded]);
    }
    assert.match(answers[2], /\r\nConnection: close\r\n/i);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});

test("a non-streaming request whose client disconnects frees its slot, running or queued", async () => {
  // one slot, 40 ms a step: 50 tokens would hold it for 2 s
  const srv = await startServer(["--max-batch", "1", "--step-delay-ms", "40"]);
  try {
    const send = (body) => {
      const s = net.connect(srv.port, "127.0.0.1");
      const b = JSON.stringify(body);
      s.on("error", () => {});
      s.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
              `Content-Length: ${b.length}\r\n\r\n${b}`);
      return s;
    };
    const running = send({ prompt: P2, max_tokens: 50, temperature: 0 });
    await until(async () => (await health(srv)).active === 1, 5000, "the first request to run");
    const queued = send({ prompt: P1, max_tokens: 50, temperature: 0 });
    await until(async () => (await health(srv)).queued === 1, 5000, "the second request to wait");
    const t0 = Date.now();
    queued.destroy();
    running.destroy();
    const h = await until(async () => { const x = await health(srv); return x.active === 0 && x.queued === 0 && x; },
                          1500, "both sequences to be dropped");
    assert.ok(Date.now() - t0 < 1500);
    assert.equal(h.cancelled, 2, JSON.stringify(h));
    assert.equal(h.kv_cache_bytes, 0);
    assert.ok(h.generated_tokens < 30, `stopped early (${h.generated_tokens} tokens of 50)`);
    const m = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(m, /^opt_serve_requests_total\{endpoint="\/v1\/completions",outcome="cancelled"\} 2$/m);
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0 });
    assert.equal(r.json.choices[0].text, G.get(P1).decoded_new);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.stderr());
  }
});
