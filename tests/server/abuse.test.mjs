// Malformed JSON, huge bodies, negative or absurd parameters, too many prompts, too long prompts, a full queue:
// each gets a JSON error {"error": {"message", "type", "param", "code"}} with a 4xx status, and the server keeps
// answering correctly afterwards.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer, postJson, getJson, assertApiError, goldens, sleep } from "./lib.mjs";

let srv;
const G = goldens();
const P1 = "Hello, my dog is cute";

before(async () => { srv = await startServer(["--max-body-bytes", "65536", "--max-prompts", "8"]); });
after(async () => { assert.equal((await srv.stop()).code, 0, srv.stderr()); });

// Writes `head`, then `chunks` one at a time until the server answers; returns the answer once the server closes
// (or 5 s pass): {raw, status (0: none), text (body), json, sentChunks}.
function rawExchange(head, chunks) {
  return new Promise((resolve) => {
    const s = net.connect(srv.port, "127.0.0.1");
    let got = Buffer.alloc(0), finished = false, sentChunks = 0;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      s.destroy();
      const raw = got.toString("latin1"), m = raw.match(/^HTTP\/1\.1 (\d{3})/);
      // the first answer's body: Content-Length bytes when it has one (the server may go on to answer the rest
      // of what was sent, as a next request on the same connection, in the same read)
      const start = got.indexOf("\r\n\r\n") + 4, len = raw.slice(0, start).match(/\r\ncontent-length: *(\d+)/i);
      const text = got.subarray(start, len ? start + Number(len[1]) : got.length).toString("utf8");
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      resolve({ raw, status: m ? Number(m[1]) : 0, text, json, sentChunks });
    };
    const timer = setTimeout(finish, 5000);
    s.on("data", (d) => {
      got = Buffer.concat([got, d]);
      const end = got.indexOf("\r\n\r\n"), len = got.toString("latin1").match(/\r\ncontent-length: *(\d+)/i);
      if (end >= 0 && len && got.length >= end + 4 + Number(len[1])) finish();  // a whole answer
    });
    s.on("error", () => {});  // a reset after the answer: what was read is kept
    s.on("close", finish);
    s.on("end", finish);
    s.on("connect", async () => {
      s.write(head);
      for (const ch of chunks) {
        if (got.length || finished) break;
        ++sentChunks;
        if (!s.write(ch)) await new Promise((r) => { s.once("drain", r); s.once("close", r); });
        await sleep(5);
      }
    });
  });
}

async function stillGood() {
  const r = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].text, G.get(P1).decoded_new);
}

test("malformed bodies: not JSON, not an object, empty, invalid UTF-8", async () => {
  for (const body of ['{"prompt": "Hello"', "{prompt: 1}", "[1, 2]", '"text"', "", "null", "\u0000\u0001"]) {
    assertApiError(await postJson(`${srv.url}/v1/completions`, body), 400);
    assertApiError(await postJson(`${srv.url}/generate`, body), 400);
  }
  const bad = Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('", "max_tokens": 2}')]);
  const r = await fetch(`${srv.url}/v1/completions`, { method: "POST", body: bad,
                                                        headers: { "Content-Type": "application/json" } });
  assert.equal(r.status, 400);
  assert.ok((await r.json()).error.message);
  await stillGood();
});

test("huge bodies: 413 with a JSON error; a chunked body (no Content-Length) 411, before it is read", async () => {
  const big = JSON.stringify({ prompt: "x".repeat(200000), max_tokens: 1 });
  const r = await postJson(`${srv.url}/v1/completions`, big);
  assertApiError(r, 413);
  // chunked upload of up to 4 MB on a raw socket, one 64 KiB chunk at a time until the server answers: it must
  // answer 411 with a JSON error at once (cpp-httplib 0.11 would read a chunked body whole, past --max-body-bytes)
  const c = await rawExchange(
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    Array.from({ length: 64 }, () => Buffer.concat([Buffer.from("10000\r\n"), Buffer.alloc(65536, 0x61), Buffer.from("\r\n")])));
  assertApiError(c, 411);
  assert.ok(c.sentChunks < 64, `the server read the whole chunked body (${c.sentChunks} chunks) before answering`);
  // a huge header: a 4xx answer (opt-serve sets no header limit of its own: cpp-httplib's CPPHTTPLIB_HEADER_MAX_LENGTH,
  // 8192 in Debian's libcpp-httplib, gives a 400, through opt-serve's error handler)
  const h = await rawExchange(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${"y".repeat(20000)}\r\n\r\n`, []);
  assert.ok(h.status >= 400 && h.status < 500, `huge header: ${h.raw.slice(0, 200) || "(no answer)"}`);
  // ... and that 4xx is 431 Request Header Fields Too Large (Beast's 8 KiB head limit), in the OpenAI error shape,
  // for one header line too long and for many short ones
  assertApiError(h, 431);
  assert.equal(h.json.error.code, "request_header_fields_too_large");
  const many = Array.from({ length: 400 }, (_, i) => `X-H${i}: ${"z".repeat(30)}\r\n`).join("");
  assertApiError(await rawExchange(`GET /health HTTP/1.1\r\nHost: x\r\n${many}\r\n`, []), 431);
  // just under the limit is fine
  const fits = await rawExchange(
    `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${"y".repeat(7000)}\r\nConnection: close\r\n\r\n`, []);
  assert.equal(fits.status, 200, fits.raw.slice(0, 200));
  await stillGood();
});

test("/v1/completions: absurd or invalid parameters are 400 with the parameter named", async () => {
  const cases = [
    [{ prompt: P1, max_tokens: -1 }, "max_tokens"],
    [{ prompt: P1, max_tokens: 1e12 }, "max_tokens"],
    [{ prompt: P1, max_tokens: 18446744073709551615 }, "max_tokens"],
    [{ prompt: P1, max_tokens: 2.5 }, "max_tokens"],
    [{ prompt: P1, max_tokens: "8" }, "max_tokens"],
    [{ prompt: P1, max_tokens: 60 }, "max_tokens"],  // 7 prompt tokens + 60 > context 64
    [{ prompt: P1, temperature: -1 }, "temperature"],
    [{ prompt: P1, temperature: 1e9 }, "temperature"],
    [{ prompt: P1, temperature: "hot" }, "temperature"],
    [{ prompt: P1, top_p: 0 }, "top_p"],
    [{ prompt: P1, top_p: 1.5 }, "top_p"],
    [{ prompt: P1, top_k: -3 }, "top_k"],
    [{ prompt: P1, repetition_penalty: 0 }, "repetition_penalty"],
    [{ prompt: P1, n: 0 }, "n"],
    [{ prompt: [P1, P1], n: 5 }, "n"],  // 10 choices > --max-prompts 8
    [{ prompt: P1, n: -1 }, "n"],
    [{ prompt: P1, best_of: 3 }, "best_of"],
    [{ prompt: P1, logprobs: 21 }, "logprobs"],
    [{ prompt: P1, presence_penalty: 3 }, "presence_penalty"],
    [{ prompt: P1, logit_bias: { 50272: 1 } }, "logit_bias"],
    [{ prompt: P1, frequency_penalty: 5 }, "frequency_penalty"],
    [{ prompt: P1, stop: ["a", "b", "c", "d", "e"] }, "stop"],
    [{ prompt: P1, stop: [1] }, "stop"],
    [{ prompt: P1, stop: "" }, "stop"],
    [{ prompt: P1, stop: { a: 1 } }, "stop"],
    [{ prompt: P1, seed: "x" }, "seed"],
    [{ prompt: P1, seed: 1.5 }, "seed"],
    [{ prompt: P1, stream: "yes" }, "stream"],
    [{ prompt: P1, stream_options: { include_usage: true } }, "stream_options"],
    [{ prompt: P1, echo: 1 }, "echo"],
    [{ prompt: P1, suffix: "x" }, "suffix"],
    [{ prompt: P1, model: 7 }, "model"],
    [{}, "prompt"],
    [{ prompt: null }, "prompt"],
    [{ prompt: 42 }, "prompt"],
    [{ prompt: {} }, "prompt"],
    [{ prompt: [] }, "prompt"],
    [{ prompt: [[]] }, "prompt"],
    [{ prompt: [true] }, "prompt"],
    [{ prompt: [2, -5] }, "prompt"],
    [{ prompt: [2, 999999] }, "prompt"],
    [{ prompt: [2, 1.5] }, "prompt"],
    [{ prompt: "word ".repeat(100) }, "prompt"],  // longer than the context
    [{ prompt: Array(9).fill("hi") }, "prompt"],  // more than --max-prompts 8
  ];
  for (const [body, param] of cases) {
    const r = await postJson(`${srv.url}/v1/completions`, body);
    assertApiError(r, 400, param);
    assert.equal(r.json.error.type, "invalid_request_error");
  }
  // streaming requests are validated before the stream starts
  assertApiError(await postJson(`${srv.url}/v1/completions`, { prompt: P1, stream: true, top_p: -1 }), 400, "top_p");
  await stillGood();
});

test("/generate: invalid requests are 400", async () => {
  const cases = [
    [{}, "prompts"], [{ prompts: "Hello" }, "prompts"], [{ prompts: [] }, "prompts"], [{ prompts: [1, 2] }, "prompts"],
    [{ prompts: Array(9).fill("x") }, "prompts"], [{ prompts: [P1], max_new_tokens: -5 }, "max_new_tokens"],
    [{ prompts: [P1], max_new_tokens: 1e9 }, "max_new_tokens"], [{ prompts: [P1], max_new_tokens: 58 }, "max_new_tokens"],
    [{ prompts: ["a ".repeat(80)] }, "prompt"],
  ];
  for (const [body, param] of cases) assertApiError(await postJson(`${srv.url}/generate`, body), 400, param);
  const ok = await postJson(`${srv.url}/generate`, { prompts: [P1], max_new_tokens: 57 });  // exactly the context
  assert.equal(ok.status, 200, ok.text);
});

test("unknown endpoints and methods: JSON 404", async () => {
  for (const [method, p] of [["GET", "/nope"], ["POST", "/v1/chat/completions"], ["GET", "/generate"],
                              ["DELETE", "/v1/completions"]]) {
    const r = await fetch(`${srv.url}${p}`, { method });
    assert.ok(r.status === 404 || r.status === 405 || r.status === 400, `${method} ${p}: ${r.status}`);
    assert.ok((await r.json()).error.message);
  }
});

test("garbage on the socket, half requests, a slow client: the server survives", async () => {
  const send = (data, { end = true, waitMs = 300 } = {}) => new Promise((resolve) => {
    const s = net.connect(srv.port, "127.0.0.1", () => { s.write(data); if (end) s.end(); });
    let got = "";
    s.on("data", (d) => { got += d; });
    s.on("error", () => resolve(got));
    s.on("close", () => resolve(got));
    setTimeout(() => { s.destroy(); resolve(got); }, waitMs);
  });
  const garbage = await send("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n");
  assert.ok(garbage === "" || /^HTTP\/1\.1 4\d\d/.test(garbage), garbage.slice(0, 80));
  await send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\"", { end: false });
  await send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n");
  await send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  await stillGood();
  assert.equal((await getJson(`${srv.url}/health`)).json.status, "ok");
});

test("a full queue: 429 with a JSON error, the admitted requests still answer correctly", async () => {
  const small = await startServer(["--max-batch", "1", "--max-queue", "2", "--step-delay-ms", "20"]);
  try {
    const body = { prompt: P1, max_tokens: 8, temperature: 0 };
    const rs = await Promise.all(Array.from({ length: 8 }, () => postJson(`${small.url}/v1/completions`, body)));
    const ok = rs.filter((r) => r.status === 200), busy = rs.filter((r) => r.status === 429);
    assert.equal(ok.length + busy.length, 8, rs.map((r) => r.status).join(","));
    assert.ok(busy.length >= 1, "some requests are refused");
    assert.ok(ok.length >= 3, "a running one plus two queued are admitted");
    for (const r of ok) assert.equal(r.json.choices[0].text, G.get(P1).decoded_new);
    for (const r of busy) {
      assertApiError(r, 429);
      assert.equal(r.json.error.code, "queue_full");
      assert.equal(r.headers.get("retry-after"), "1");
    }
    // a request with more prompts than the server can ever hold is invalid, not busy
    const many = await postJson(`${small.url}/generate`, { prompts: ["a", "b", "c", "d", "e"], max_new_tokens: 2 });
    assertApiError(many, 400, "prompt");
    // and once the queue drains, requests are admitted again
    const again = await postJson(`${small.url}/v1/completions`, body);
    assert.equal(again.status, 200);
  } finally {
    assert.equal((await small.stop()).code, 0);
  }
});

test("--max-tokens-limit caps the default budgets too (found by fuzz_serve_request)", async () => {
  const capped = await startServer(["--max-tokens-limit", "3"]);
  try {
    // no max_tokens: OpenAI's default 16 would pass the limit; it is capped at 3
    const c = await postJson(`${capped.url}/v1/completions`, { prompt: P1, temperature: 0 });
    assert.equal(c.status, 200, c.text);
    assert.ok(c.json.usage.completion_tokens <= 3, c.text);
    // no max_new_tokens on /generate: the default 50 is capped at 3
    const g = await postJson(`${capped.url}/generate`, { prompts: [P1] });
    assert.equal(g.status, 200, g.text);
    assert.ok(g.json.texts[0].startsWith(P1));
    // an explicit budget beyond the limit is refused, naming it
    assertApiError(await postJson(`${capped.url}/v1/completions`, { prompt: P1, max_tokens: 4 }), 400, "max_tokens");
    assertApiError(await postJson(`${capped.url}/generate`, { prompts: [P1], max_new_tokens: 4 }), 400,
                   "max_new_tokens");
  } finally {
    assert.equal((await capped.stop()).code, 0);
  }
});
