// The page at "/" in headless Chromium (Debian's chromium, driven by playwright-core): type a prompt, press
// Generate, watch the text stream in, read the answer back; then stop a stream from the page.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { startServer, postJson, getJson, until, goldens, CI, OUT } from "./lib.mjs";

const CHROMIUM = process.env.OPT_CHROMIUM ?? "/usr/bin/chromium";
const HAVE_PW = existsSync(new URL("./node_modules/playwright-core/package.json", import.meta.url));
const missing = !HAVE_PW ? "playwright-core (npm ci --prefix tests/server)" : !existsSync(CHROMIUM) ? CHROMIUM : "";
const skip = missing && !CI ? `${missing} is not installed` : false;
const G = goldens();
const P1 = "Hello, my dog is cute";
let srv, browser, profile;  // browser: a BrowserContext

before(async () => {
  if (skip) return;
  assert.equal(missing, "", `${missing} is missing (apt-get install chromium; npm ci --prefix tests/server)`);
  const { chromium } = await import("playwright-core");
  profile = mkdtempSync(path.join(os.tmpdir(), "opt-serve-chromium-"));
  srv = await startServer(["--step-delay-ms", "60"]);  // slow enough to see the text arrive piece by piece
  // a fresh profile: launchPersistentContext takes the --user-data-dir itself
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60000,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  });
});
after(async () => {
  if (browser) await browser.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  if (srv) assert.equal((await srv.stop()).code, 0, srv.stderr());
});

test("a prompt typed into the page streams its answer", { skip, timeout: 120000 }, async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(srv.url + "/", { timeout: 20000 });
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("opt-tiny-realvocab"),
                             null, { timeout: 10000 });
  await page.fill("#prompt", P1);
  await page.fill("#max_tokens", "8");
  await page.fill("#temperature", "0");
  // record every distinct state of the answer while it streams
  await page.evaluate(() => {
    window.__seen = [];
    new MutationObserver(() => window.__seen.push(document.getElementById("answer").textContent))
      .observe(document.getElementById("answer"), { childList: true, characterData: true, subtree: true });
  });
  await page.click("#go");
  await page.waitForSelector('#out[data-state="done"]', { timeout: 30000 });
  const answer = await page.textContent("#answer");
  const seen = await page.evaluate(() => window.__seen);
  const status = await page.textContent("#status");
  await page.screenshot({ path: path.join(OUT, "opt-serve-page.png") });
  assert.equal(answer, G.get(P1).decoded_new);
  assert.equal(await page.textContent("#prompt-echo"), P1);
  const partial = seen.filter((t) => t.length > 0 && t.length < answer.length);
  assert.ok(partial.length >= 3, `the text arrived in pieces: ${JSON.stringify(seen)}`);
  for (const t of partial) assert.ok(answer.startsWith(t), `a partial answer is a prefix: ${t}`);
  assert.match(status, /done: length/);
  assert.match(status, /8 tokens/);
  assert.deepEqual(errors, []);
  // the page's answer is the API's answer
  const api = await postJson(`${srv.url}/v1/completions`, { prompt: P1, max_tokens: 8, temperature: 0 });
  assert.equal(api.json.choices[0].text, answer);
  await page.close();
});

test("the Stop button ends the stream and frees the server's slot", { skip, timeout: 120000 }, async () => {
  const page = await browser.newPage();
  await page.goto(srv.url + "/", { timeout: 20000 });
  await page.fill("#prompt", "The capital of France is");
  await page.fill("#max_tokens", "50");
  await page.fill("#temperature", "0");
  const before = (await getJson(`${srv.url}/health`)).json.cancelled;
  await page.click("#go");
  await page.waitForFunction(() => document.getElementById("answer").textContent.length > 0, null, { timeout: 20000 });
  await page.click("#cancel");
  await page.waitForSelector('#out[data-state="stopped"]', { timeout: 10000 });
  assert.match(await page.textContent("#status"), /stopped/);
  await until(async () => {
    const h = (await getJson(`${srv.url}/health`)).json;
    return h.active === 0 && h.cancelled > before;
  }, 5000, "the server to drop the stopped stream");
  await page.close();
});

test("with --api-key the page loads, and its API key field sends the key", { skip, timeout: 120000 }, async () => {
  const keyed = await startServer(["--api-key", "page-s3cret"]);
  const page = await browser.newPage();
  try {
    const auth = [];
    page.on("request", (r) => {
      const p = new URL(r.url()).pathname;
      if (p.startsWith("/v1/")) auth.push(r.allHeaders().then((h) => [p, h.authorization ?? null]));
    });
    await page.goto(keyed.url + "/", { timeout: 20000 });
    // without the key the page says what is missing, and a generation is refused with the server's message
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("needs an API key"),
                               null, { timeout: 10000 });
    await page.fill("#prompt", P1);
    await page.fill("#max_tokens", "8");
    await page.fill("#temperature", "0");
    await page.click("#go");
    await page.waitForSelector('#out[data-state="error"]', { timeout: 10000 });
    assert.match(await page.textContent("#status"), /invalid or missing API key/);
    // with it: the model line, then the golden answer
    const before = auth.length;
    await page.fill("#api_key", "page-s3cret");
    await page.dispatchEvent("#api_key", "change");
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("opt-tiny-realvocab"),
                               null, { timeout: 10000 });
    await page.click("#go");
    await page.waitForSelector('#out[data-state="done"]', { timeout: 30000 });
    assert.equal(await page.textContent("#answer"), G.get(P1).decoded_new);
    // every call before the key was typed went without one, every call after it with it (the field's change
    // reloads the model line: once when the test fires it, once more when the click leaves the field)
    const calls = await Promise.all(auth);
    const without = calls.slice(0, before), withKey = calls.slice(before);
    assert.deepEqual(without, [["/v1/models", null], ["/v1/completions", null]]);
    assert.ok(withKey.every(([, a]) => a === "Bearer page-s3cret"), JSON.stringify(withKey));
    assert.deepEqual([...new Set(withKey.map(([p]) => p))].sort(), ["/v1/completions", "/v1/models"]);
    assert.equal(withKey.at(-1)[0], "/v1/completions");
    // the key stays for the tab (sessionStorage): a reload uses it at once
    await page.reload();
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("opt-tiny-realvocab"),
                               null, { timeout: 10000 });
  } finally {
    await page.close();
    assert.equal((await keyed.stop()).code, 0, keyed.stderr());
  }
});
