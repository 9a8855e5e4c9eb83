// nginx in front of opt-serve replicas, for tests/server/nginx_replicas.mjs and bench/bench_replicas.mjs: finds
// the nginx program, and runs the real deploy/nginx/opt-serve.conf in a prefix of its own (a temporary folder)
// with its four loopback ports rewritten (nothing else of the file changes).
import { spawn } from "node:child_process";
import { accessSync, constants, chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

export const CONF = path.resolve(import.meta.dirname, "../../deploy/nginx/opt-serve.conf");

// The nginx program: OPT_NGINX, else `nginx` on the PATH or in the usual sbin folders; null when there is none.
export function findNginx() {
  const dirs = [...(process.env.PATH ?? "").split(":"), "/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"];
  const candidates = process.env.OPT_NGINX ? [process.env.OPT_NGINX]
                                           : dirs.filter((d) => d).map((d) => path.join(d, "nginx"));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      return c;
    } catch { /* not there */ }
  }
  return null;
}

// A loopback port nobody listens on now.
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// deploy/nginx/opt-serve.conf with its front port 8080 made `front` and its replicas 8081.. made `replicas`
// (outside comments the file must name each of its four addresses exactly once; a replica line beyond
// `replicas` is removed).
export function rewriteConf(text, front, replicas) {
  const code = text.split("\n").filter((l) => !l.trim().startsWith("#")).join("\n");
  const count = (s) => code.split(s).length - 1;
  for (const p of [8080, 8081, 8082, 8083])
    if (count(`127.0.0.1:${p}`) !== 1) throw new Error(`${CONF} names 127.0.0.1:${p} ${count(`127.0.0.1:${p}`)} times`);
  let out = text.replace("listen 127.0.0.1:8080;", `listen 127.0.0.1:${front};`);
  if (out === text) throw new Error(`${CONF} has no "listen 127.0.0.1:8080;"`);
  [8081, 8082, 8083].forEach((p, i) => {
    const line = new RegExp(`^(\\s*)server 127\\.0\\.0\\.1:${p}( [^;]*)?;\\n`, "m");
    if (!line.test(out)) throw new Error(`${CONF} has no "server 127.0.0.1:${p} ...;" line`);
    out = out.replace(line, i < replicas.length ? `$1server 127.0.0.1:${replicas[i]}$2;\n` : "");
  });
  return out;
}

// Starts nginx on the rewritten file, in a new prefix, as the file says it runs:
// `nginx -p PREFIX -c CONF -g 'daemon off;'`. Resolves once it answers on `front`.
export async function startNginx(nginx, front, replicas) {
  const prefix = mkdtempSync(path.join(os.tmpdir(), "opt-nginx-"));
  chmodSync(prefix, 0o755);  // run as root, nginx's workers are `nobody` and must reach temp/
  mkdirSync(path.join(prefix, "logs"));
  mkdirSync(path.join(prefix, "temp"));
  const conf = path.join(prefix, "opt-serve.conf");
  writeFileSync(conf, rewriteConf(readFileSync(CONF, "utf8"), front, replicas));
  const proc = spawn(nginx, ["-p", prefix + "/", "-c", conf, "-g", "daemon off;"],
                     { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  proc.stdout.on("data", () => {});
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  const log = () => {
    let l = "";
    try { l = readFileSync(path.join(prefix, "logs", "error.log"), "utf8"); } catch { /* none yet */ }
    return stderr + l;
  };
  const url = `http://127.0.0.1:${front}`;
  const t0 = Date.now();
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`nginx exited at start:\n${log()}`);
    const up = await new Promise((resolve) => {
      const s = net.connect(front, "127.0.0.1");
      s.on("connect", () => { s.destroy(); resolve(true); });
      s.on("error", () => resolve(false));
    });
    if (up) break;
    if (Date.now() - t0 > 10000) {
      proc.kill("SIGKILL");
      throw new Error(`nginx did not listen on ${front} within 10 s:\n${log()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url, proc, prefix, log,
    // SIGQUIT (nginx's graceful stop), SIGKILL after 10 s; the prefix is removed
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGQUIT");
        let timer;
        const r = await Promise.race([exited, new Promise((res) => { timer = setTimeout(() => res(null), 10000); })]);
        clearTimeout(timer);
        if (r === null) proc.kill("SIGKILL");
        await exited;
      }
      rmSync(prefix, { recursive: true, force: true });
      return exited;
    },
  };
}
