// A client (or a proxy such as nginx) that closes its connection the moment a stream's last chunk arrives: the
// server sees the close while its last write is completing. It once dereferenced the request it had already let
// go of and crashed (SIGSEGV), within about a hundred such streams on this machine.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer } from "./lib.mjs";

test("streams whose clients close as the last chunk arrives: the server stays up", async () => {
  const srv = await startServer(["--threads", "1"]);
  const body = JSON.stringify({ prompt: "Hi", max_tokens: 1, temperature: 0, stream: true });
  const req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
              `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
  let ended = 0;
  const one = () => new Promise((resolve) => {
    const s = net.connect(srv.port, "127.0.0.1", () => s.write(req));
    let got = "";
    s.setTimeout(10000, () => s.destroy());
    s.on("data", (d) => {
      got += d;
      if (got.endsWith("0\r\n\r\n")) {  // the end of the chunked body: close at once
        ended++;
        s.destroy();
      }
    });
    s.on("error", () => {});
    s.on("close", resolve);
  });
  const t0 = Date.now();
  let n = 0;
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (n < 3000 && Date.now() - t0 < 10000 && srv.proc.exitCode === null && srv.proc.signalCode === null) {
      n++;
      await one();
    }
  }));
  assert.equal(srv.proc.signalCode, null, `opt-serve died after ${n} streams:\n${srv.stderr()}`);
  assert.ok(ended > 100, `only ${ended} of ${n} streams reached their end`);
  const h = await fetch(`${srv.url}/health`, { signal: AbortSignal.timeout(5000) });
  assert.equal(h.status, 200);
  assert.equal((await srv.stop()).code, 0, srv.stderr());
});
