// The page opt-serve serves at "/": type a prompt, watch the answer stream from /v1/completions (server-sent
// events read with fetch + a stream reader). Plain HTML + JS, no build step, no outside resources. The page itself
// needs no API key; a server started with --api-key wants one for the calls the page makes: the "API key" field
// (kept in the tab's sessionStorage) sends it as "Authorization: Bearer <key>".
#pragma once

namespace opt_serve {

inline constexpr const char* page_html = R"OPTPAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>opt-serve</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.3rem; margin-bottom: .2rem; }
  #model { color: #666; font-size: .9rem; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .5rem; }
  .row { display: flex; gap: 1rem; align-items: center; flex-wrap: wrap; margin: .6rem 0; }
  label { font-size: .9rem; }
  input[type=number] { width: 5rem; }
  button { font: inherit; padding: .35rem 1rem; }
  #out { white-space: pre-wrap; border: 1px solid #ccc; border-radius: 4px; padding: .7rem; min-height: 6rem;
         background: #fafafa; font-family: ui-monospace, monospace; }
  #prompt-echo { color: #777; }
  #status { color: #666; font-size: .85rem; min-height: 1.2rem; }
  .error { color: #b00; }
</style>
</head>
<body>
<h1>opt-serve</h1>
<div id="model">&nbsp;</div>
<form id="form">
  <textarea id="prompt" rows="4" placeholder="Type a prompt">Hello, my name is</textarea>
  <div class="row">
    <label>max tokens <input id="max_tokens" type="number" min="1" step="1" value="48"></label>
    <label>temperature <input id="temperature" type="number" min="0" max="2" step="any" value="0.7"></label>
    <label>top p <input id="top_p" type="number" min="0.01" max="1" step="any" value="0.9"></label>
    <label>stop <input id="stop" type="text" size="8" placeholder="(none)"></label>
    <label>API key <input id="api_key" type="password" size="12" placeholder="(none)" autocomplete="off"></label>
    <button id="go" type="submit">Generate</button>
    <button id="cancel" type="button" disabled>Stop</button>
  </div>
</form>
<div id="out"><span id="prompt-echo"></span><span id="answer"></span></div>
<div id="status"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let controller = null;

// the key for a server started with --api-key (empty: none sent)
function authHeaders() {
  const key = $("api_key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

function loadModel() {
  fetch("/v1/models", { headers: authHeaders() }).then((r) => r.json()).then((m) => {
    const d = m.data && m.data[0];
    if (d) $("model").textContent = d.id + " \u00b7 context " + d.max_model_len + " tokens";
    else if (m.error) $("model").textContent = m.error.code === "invalid_api_key"
        ? "this server needs an API key: type it in the API key field" : m.error.message;
  }).catch(() => {});
}
$("api_key").value = sessionStorage.getItem("opt-serve-api-key") || "";
$("api_key").addEventListener("input", () => sessionStorage.setItem("opt-serve-api-key", $("api_key").value.trim()));
$("api_key").addEventListener("change", loadModel);
loadModel();

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function generate(ev) {
  ev.preventDefault();
  if (controller) return;
  const prompt = $("prompt").value;
  const body = {
    prompt: prompt,
    max_tokens: Number($("max_tokens").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top_p").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  if ($("stop").value) body.stop = $("stop").value;
  $("prompt-echo").textContent = prompt;
  $("answer").textContent = "";
  $("out").dataset.state = "streaming";
  $("go").disabled = true;
  $("cancel").disabled = false;
  setStatus("waiting\u2026");
  controller = new AbortController();
  const t0 = performance.now();
  let tFirst = 0, finish = null, usage = null;
  try {
    const res = await fetch("/v1/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) {
      let msg = "HTTP " + res.status;
      try { msg = (await res.json()).error.message; } catch (e) {}
      throw new Error(msg);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          for (const c of chunk.choices || []) {
            if (c.text) {
              if (!tFirst) tFirst = performance.now();
              $("answer").textContent += c.text;
            }
            if (c.finish_reason) finish = c.finish_reason;
          }
        }
      }
    }
    const secs = (performance.now() - t0) / 1000;
    let s = "done: " + (finish || "?") + " \u00b7 " + secs.toFixed(2) + " s";
    if (usage) s += " \u00b7 " + usage.completion_tokens + " tokens (" +
                    (usage.completion_tokens / secs).toFixed(1) + " tok/s)";
    if (tFirst) s += " \u00b7 first text after " + ((tFirst - t0)).toFixed(0) + " ms";
    setStatus(s);
    $("out").dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") { setStatus("stopped"); $("out").dataset.state = "stopped"; }
    else { setStatus("error: " + e.message, true); $("out").dataset.state = "error"; }
  } finally {
    controller = null;
    $("go").disabled = false;
    $("cancel").disabled = true;
  }
}

$("form").addEventListener("submit", generate);
$("cancel").addEventListener("click", () => { if (controller) controller.abort(); });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
});
</script>
</body>
</html>
)OPTPAGE";

}  // namespace opt_serve
