// A child process of connections.test.mjs: holds `n` slow connections to 127.0.0.1:`port` (slowloris: a request
// head sent one byte every `every` ms, never finished) and reports to its parent over IPC: {opened} once all are
// connected, then {closed} (how many the server closed) whenever asked with "count"; "stop" closes them all.
// A process of its own so that its file descriptors do not count against the test's limit.
import net from "node:net";

const [port, n, every] = process.argv.slice(2).map(Number);
const socks = [];
let closed = 0, opened = 0;
const head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + "a".repeat(4000);
for (let i = 0; i < n; i++) {
  const s = net.connect(port, "127.0.0.1");
  s.pos = 0;
  s.on("connect", () => {
    if (++opened === n) process.send({ opened });
    s.write(head[s.pos++]);
  });
  s.on("error", () => {});
  s.on("close", () => { closed++; });
  socks.push(s);
}
const timer = setInterval(() => {
  for (const s of socks) if (!s.destroyed && s.pos < head.length) s.write(head[s.pos++]);
}, every);
process.on("message", (m) => {
  if (m === "count") process.send({ opened, closed });
  if (m === "stop") {
    clearInterval(timer);
    for (const s of socks) s.destroy();
    process.send({ stopped: true });
    setTimeout(() => process.exit(0), 50);
  }
});
