// The command-line contracts of README.md ("Command-line programs"), driven as a user drives them and compared
// with the Hugging Face goldens in ../shared: opt-generate --jsonl (ids / new_ids / text / logits, either padding
// side), opt-tokenize --jsonl (encode, --no-bos, --decode, --keep-special, --no-cleanup), opt-convert (and
// --dtype, --quantize int8, --packed), opt-make-random (and --dtype int8), and the exit-code contract (0 on
// success; otherwise exactly one line on stderr and a non-zero code).
// Run by ctest (tests/CMakeLists.txt) with OPT_GENERATE, OPT_TOKENIZE, OPT_CONVERT, OPT_MAKE_RANDOM = the programs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync, copyFileSync } from "node:fs";
import path from "node:path";

const SHARED = process.env.OPT_SHARED_DIR ?? path.resolve(import.meta.dirname, "../../../shared");
const FIX = path.join(SHARED, "fixtures");
const TOKDIR = path.join(SHARED, "tokenizer");
const OUT = process.env.OPT_TEST_OUT ?? "/tmp";
const PROG = {
  generate: process.env.OPT_GENERATE,
  tokenize: process.env.OPT_TOKENIZE,
  convert: process.env.OPT_CONVERT,
  make_random: process.env.OPT_MAKE_RANDOM,
};
for (const [k, p] of Object.entries(PROG)) assert.ok(p && existsSync(p), `OPT_${k.toUpperCase()}=${p} is not the program`);

const goldens = (model) => JSON.parse(readFileSync(path.join(FIX, model, "goldens.json"), "utf8"));
const gcase = (model, name) => goldens(model).cases.find((c) => c.name === name);
function f32(model, desc) {
  const b = readFileSync(path.join(FIX, model, desc.file));
  assert.equal(b.length, desc.nbytes);
  return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
}

// Runs a program; `ok` (default) requires the success half of the contract: exit 0, nothing on stderr.
function run(prog, args, input, { ok = true } = {}) {
  const r = spawnSync(PROG[prog], args, { input: input ?? "", encoding: "utf8", maxBuffer: 1 << 28, timeout: 120000 });
  // a program that fails may exit before it has read all of its input: EPIPE on our side, its status and stderr
  // still there to check
  if (!(r.error?.code === "EPIPE" && !ok)) assert.equal(r.error, undefined, String(r.error));
  if (ok) {
    assert.equal(r.status, 0, `${prog} ${args.join(" ")}: exit ${r.status} ${r.signal ?? ""}\n${r.stderr}`);
    assert.equal(r.stderr, "", `${prog}: stderr on success`);
  }
  return r;
}
const lines = (stdout) => { assert.ok(stdout.endsWith("\n"), "output ends with a newline"); return stdout.slice(0, -1).split("\n").map((l) => JSON.parse(l)); };
const jsonl = (objs) => objs.map((o) => JSON.stringify(o)).join("\n") + "\n";

// The failure half: a non-zero exit and exactly one non-empty line on stderr.
function assertFails(prog, args, input, what) {
  const r = run(prog, args, input, { ok: false });
  assert.equal(r.signal, null, `${what}: killed by ${r.signal}`);
  assert.notEqual(r.status, 0, `${what}: exit 0\nstdout: ${r.stdout.slice(0, 300)}`);
  assert.match(r.stderr, /^[^\n]+\n$/, `${what}: stderr is not exactly one line: ${JSON.stringify(r.stderr)}`);
  return r;
}

function maxAbsDiff(a, b) {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

test("opt-generate --jsonl: ids, new_ids, text for {ids} and {prompt} lines, left and right padding", () => {
  const m = path.join(FIX, "opt-tiny-realvocab");
  for (const name of ["batch_left", "batch_right"]) {
    const c = gcase("opt-tiny-realvocab", name), gen = c.generate;
    for (const padding of ["left", "right"]) {
      for (const input of [c.prompts.map((ids) => ({ ids })), c.texts.map((prompt) => ({ prompt }))]) {
        const out = lines(run("generate", ["-m", m, "-t", TOKDIR, "-n", String(gen.max_new_tokens), "--padding", padding,
                                            "--jsonl", "-"], jsonl(input)).stdout);
        assert.equal(out.length, c.prompts.length, "one output line per input line");
        out.forEach((o, b) => {
          const alone = gen.alone[b];
          assert.deepEqual(Object.keys(o).sort(), ["ids", "new_ids", "text"], `${name} ${padding} row ${b}`);
          assert.deepEqual(o.new_ids, alone.new_tokens, `${name} ${padding} row ${b}: new_ids`);
          assert.deepEqual(o.ids, [...c.prompts[b], ...alone.new_tokens], `${name} ${padding} row ${b}: ids unpadded`);
          assert.equal(o.text, alone.decoded, `${name} ${padding} row ${b}: text`);
        });
      }
    }
  }
});

test("opt-generate --jsonl --logits: the logits that chose the first new token; no text without a tokenizer", () => {
  // realvocab batch_left: the last-position logits of each row, [B, V]
  const c = gcase("opt-tiny-realvocab", "batch_left");
  const V = c.logits_last.shape[1], want = f32("opt-tiny-realvocab", c.logits_last);
  const out = lines(run("generate", ["-m", path.join(FIX, "opt-tiny-realvocab"), "-t", TOKDIR, "-n", "1", "--logits",
                                      "--jsonl", "-"], jsonl(c.prompts.map((ids) => ({ ids })))).stdout);
  out.forEach((o, b) => {
    assert.equal(o.logits.length, V);
    const d = maxAbsDiff(o.logits, want.subarray(b * V, (b + 1) * V));
    assert.ok(d <= 1e-4, `row ${b}: max |logits - golden| = ${d}`);
  });
  // opt-tiny-preln (no tokenizer in the folder): full [B, T, V] logits, take each row's last real position
  for (const name of ["batch_left", "batch_right"]) {
    const p = gcase("opt-tiny-preln", name), [B, T, V2] = p.logits.shape, all = f32("opt-tiny-preln", p.logits);
    for (const padding of ["left", "right"]) {
      const o2 = lines(run("generate", ["-m", path.join(FIX, "opt-tiny-preln"), "-n", "2", "--logits", "--padding", padding,
                                         "--jsonl", "-"], jsonl(p.prompts.map((ids) => ({ ids })))).stdout);
      assert.equal(o2.length, B);
      o2.forEach((o, b) => {
        assert.deepEqual(Object.keys(o).sort(), ["ids", "logits", "new_ids"], "no \"text\" without a tokenizer");
        const t = p.padding === "left" ? T - 1 : p.prompts[b].length - 1;
        const d = maxAbsDiff(o.logits, all.subarray((b * T + t) * V2, (b * T + t + 1) * V2));
        assert.ok(d <= 1e-4, `preln ${name} ${padding} row ${b}: max |logits - golden| = ${d}`);
        assert.deepEqual(o.new_ids, p.generate.alone[b].new_tokens.slice(0, 2));
      });
    }
  }
});

test("opt-generate --jsonl: ids the tokenizer lacks stay in ids and new_ids, and are left out of the text", () => {
  const prompt = [2, 31414, 50265, 6, 50271, 127];
  const [o] = lines(run("generate", ["-m", path.join(FIX, "opt-tiny-realvocab"), "-t", TOKDIR, "-n", "3", "--jsonl", "-"],
                        jsonl([{ ids: prompt }])).stdout);
  assert.deepEqual(o.ids.slice(0, prompt.length), prompt);
  assert.deepEqual(o.ids.slice(prompt.length), o.new_ids);
  assert.equal(o.new_ids.length, 3);
  const known = o.ids.filter((i) => i < 50265);
  const [d] = lines(run("tokenize", ["-t", TOKDIR, "--decode", "--jsonl", "-"], jsonl([{ ids: known }])).stdout);
  assert.equal(o.text, d.text);
});

test("opt-generate speculative (--lookup, --draft-self, --draft): the same output lines byte for byte, faster or not", () => {
  const m = path.join(FIX, "opt-tiny-realvocab");
  for (const name of ["batch_left", "batch_right"]) {
    const c = gcase("opt-tiny-realvocab", name), gen = c.generate;
    const args = ["-m", m, "-t", TOKDIR, "-n", String(gen.max_new_tokens), "--logits", "--jsonl", "-"];
    const input = jsonl(c.prompts.map((ids) => ({ ids })));
    const plain = run("generate", args, input).stdout;
    for (const flags of [["--lookup", "2"], ["--draft-self", "int8", "--draft-tokens", "7"], ["--draft-self", "int4"],
                         ["--draft", m, "--draft-tokens", "1"]]) {
      assert.equal(run("generate", [...args, ...flags], input).stdout, plain, `${name} ${flags.join(" ")}`);
      // --stats: the timing line and the drafter's (acceptance, tokens per pass) on stderr, stdout unchanged
      const r = run("generate", [...args, ...flags, "--stats"], input, { ok: false });
      assert.equal(r.status, 0);
      assert.equal(r.stdout, plain);
      assert.match(r.stderr, /\nspeculative: .* \| \d+ passes, \d+ proposed, \d+ accepted \([0-9.]+%\) \| [0-9.]+ tokens per pass\n$/);
    }
    // the model as its own draft accepts everything
    const r = run("generate", [...args, "--draft", m, "--stats"], input, { ok: false });
    assert.match(r.stderr, /accepted \(100\.0%\)/, r.stderr);
  }
  const p = ["-m", m, "-t", TOKDIR, "-p", "Hello"];
  assertFails("generate", [...p, "--lookup", "2", "--draft-self", "int8"], "", "two drafters");
  // speculative sampling: a seed gives the same text again (draws of its own: the same distribution as plain sampling)
  const sampled = [...p, "-n", "12", "--temp", "0.9", "--top-k", "20", "--seed", "5", "--no-stream"];
  for (const flags of [["--lookup", "2"], ["--draft-self", "int8"]]) {
    const go = () => {  // -p prints its timing on stderr
      const r = run("generate", [...sampled, ...flags], "", { ok: false });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout;
    };
    const once = go();
    assert.ok(once.startsWith("Hello"), once);
    assert.equal(go(), once);
  }
  assertFails("generate", [...p, "--draft-self", "int3"], "", "unknown --draft-self");
  assertFails("generate", [...p, "--draft", path.join(FIX, "no-such-model")], "", "missing draft folder");
  assertFails("generate", [...p, "--draft", path.join(FIX, "opt-tiny-realvocab"), "--draft-tokens", "0"], "", "K = 0");
});

test("opt-generate --kv-cache: f32 prints the default's bytes; f16 and bf16 stay near the goldens", () => {
  const c = gcase("opt-tiny-realvocab", "batch_left");
  const V = c.logits_last.shape[1], want = f32("opt-tiny-realvocab", c.logits_last);
  const args = ["-m", path.join(FIX, "opt-tiny-realvocab"), "-t", TOKDIR, "-n", "4", "--logits", "--jsonl", "-"];
  const input = jsonl(c.prompts.map((ids) => ({ ids })));
  const base = run("generate", args, input).stdout;
  assert.equal(run("generate", [...args, "--kv-cache", "f32"], input).stdout, base, "--kv-cache f32 is the default");
  // the logits that chose the first token: the prompt pass reads the rounded cache too (measured: f16 1.4e-3, bf16
  // 1.1e-2)
  for (const [kv, tol] of [["f16", 5e-3], ["bf16", 5e-2]]) {
    const out = lines(run("generate", [...args, "--kv-cache", kv], input).stdout);
    out.forEach((o, b) => {
      const d = maxAbsDiff(o.logits, want.subarray(b * V, (b + 1) * V));
      assert.ok(d <= tol && d > 0, `--kv-cache ${kv} row ${b}: max |logits - golden| = ${d}`);
    });
  }
  const r = assertFails("generate", [...args, "--kv-cache", "f8"], input, "bad --kv-cache");
  assert.match(r.stderr, /--kv-cache: unknown KV cache type 'f8' \(expected f32, f16 or bf16\)/);
});

test("opt-tokenize --jsonl: every golden string, with and without BOS", () => {
  const t = JSON.parse(readFileSync(path.join(TOKDIR, "tok_goldens.json"), "utf8"));
  const input = t.encode.map((e) => JSON.stringify(e.text)).join("\n") + "\n";
  const out = lines(run("tokenize", ["-t", TOKDIR, "--jsonl", "-"], input).stdout);
  assert.equal(out.length, t.encode.length);
  out.forEach((o, i) => assert.deepEqual(o, { ids: t.encode[i].ids }, JSON.stringify(t.encode[i].text)));
  const nb = lines(run("tokenize", ["-t", TOKDIR, "--no-bos", "--jsonl", "-"], input).stdout);
  nb.forEach((o, i) => assert.deepEqual(o, { ids: t.encode[i].ids_no_special }, JSON.stringify(t.encode[i].text)));
});

test("opt-tokenize --decode: skip special + cleanup by default, --keep-special, --no-cleanup", () => {
  const t = JSON.parse(readFileSync(path.join(TOKDIR, "tok_goldens.json"), "utf8"));
  // ids the tokenizer lacks: transformers raises; opt-tokenize fails (one line naming the id)
  const errs = t.decode.filter((d) => d.ids && d.skip_true_cleanup_true.error);
  const dec = t.decode.filter((d) => d.ids && !errs.includes(d)), each = t.decode.filter((d) => d.ids_each);
  assert.equal(dec.length + each.length + errs.length, t.decode.length);
  assert.ok(errs.length >= 1);
  for (const d of errs) {
    const r = assertFails("tokenize", ["-t", TOKDIR, "--decode", "--jsonl", "-"], jsonl([{ ids: d.ids }]), d.name);
    assert.match(r.stderr, new RegExp(`id ${d.ids.find((i) => i > 50264)}\\b`), d.name);
    assert.equal(r.stdout, "");
  }
  const input = jsonl(dec.map((d) => ({ ids: d.ids })));
  for (const [flags, key] of [[[], "skip_true_cleanup_true"], [["--keep-special"], "skip_false_cleanup_true"],
                              [["--no-cleanup"], "skip_true_cleanup_false"]]) {
    const out = lines(run("tokenize", ["-t", TOKDIR, "--decode", ...flags, "--jsonl", "-"], input).stdout);
    assert.equal(out.length, dec.length);
    out.forEach((o, i) => assert.deepEqual(o, { text: dec[i][key].text }, `${dec[i].name} ${flags}`));
  }
  // pieces decoded one line each (a lone byte of a multi-byte character is U+FFFD)
  for (const d of each) {
    const out = lines(run("tokenize", ["-t", TOKDIR, "--decode", "--jsonl", "-"], jsonl(d.ids_each.map((ids) => ({ ids })))).stdout);
    assert.deepEqual(out, d.text_each.map((text) => ({ text })), d.name);
  }
  // the encode goldens' decodes too (every string of the encode set)
  const enc = t.encode;
  const out = lines(run("tokenize", ["-t", TOKDIR, "--decode", "--jsonl", "-"], jsonl(enc.map((e) => ({ ids: e.ids })))).stdout);
  out.forEach((o, i) => assert.deepEqual(o, { text: enc[i].decode_skip_special }, JSON.stringify(enc[i].text)));
});

function safetensorsHeader(file) {
  const b = readFileSync(file);
  const n = Number(b.readBigUInt64LE(0));
  return { header: JSON.parse(b.subarray(8, 8 + n).toString("utf8")), dataStart: 8 + n };
}
function safetensorsDtypes(file) {
  const h = safetensorsHeader(file).header;
  return new Set(Object.entries(h).filter(([k]) => k !== "__metadata__").map(([, v]) => v.dtype));
}
// The stored packed format (include/opt/packed.hpp) in every shard of `dir`: the scheme in __metadata__, the linear
// weights as .panels (U8) + .scales (F32, int8 / int4 only), each starting 64-byte aligned in the file, and the data without
// holes (safetensors' rule: the tensors cover the data section exactly); returns the scheme.
function checkPacked(dir, weightType) {
  const files = readdirSync(dir).filter((f) => f.endsWith(".safetensors"));
  assert.ok(files.length >= 1);
  let scheme = null;
  for (const f of files) {
    const { header, dataStart } = safetensorsHeader(path.join(dir, f));
    const md = header.__metadata__;
    assert.equal(md["opt.format"], "packed", f);
    assert.equal(md["opt.format_version"], "2", f);
    assert.equal(md["opt.panel_rows"], "16", f);
    assert.equal(md["opt.weight_group"], /^I[48]$/.test(weightType) ? "4" : "2", f);
    assert.equal(md["opt.weight_type"], weightType, f);
    scheme ??= md;
    assert.deepEqual(md, scheme, `${f}: the same scheme in every shard`);
    for (const [name, t] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      assert.ok(!/(q_proj|k_proj|v_proj|out_proj|fc1|fc2)\.weight$/.test(name), `${name}: stored plain`);
      if (name.endsWith(".panels")) assert.equal(t.dtype, "U8", name);
      if (name.endsWith(".scales")) assert.equal(t.dtype, "F32", name);
      if (/\.(panels|scales)$/.test(name)) assert.equal((dataStart + t.data_offsets[0]) % 64, 0, `${name} aligned`);
    }
    const spans = Object.entries(header).filter(([k]) => k !== "__metadata__").map(([, t]) => t.data_offsets)
      .sort((a, b) => a[0] - b[0]);
    let end = 0;
    for (const [b, e] of spans) {
      assert.equal(b, end, `${f}: a hole or overlap at ${end}`);
      end = e;
    }
    assert.equal(dataStart + end, statSync(path.join(dir, f)).size, `${f}: data ends with the file`);
  }
  return scheme;
}
const idsOf = (c) => jsonl(c.prompts.map((ids) => ({ ids })));

test("opt-convert: pytorch_model.bin -> safetensors (as stored, --dtype f32/bf16) that load to the goldens", () => {
  const hub = path.join(FIX, "opt-tiny-preln-hubstyle");
  const c = gcase("opt-tiny-preln-hubstyle", "batch_left"), [B, T, V] = c.logits.shape;
  const all = f32("opt-tiny-preln-hubstyle", c.logits);
  const tmp = mkdtempSync(path.join(OUT, "opt-convert-"));
  try {
    // the output folder holds only what opt-convert wrote (and config.json), so what loads is the conversion
    for (const [dtype, want, tol] of [[null, "F16", 1e-4], ["f32", "F32", 1e-4], ["bf16", "BF16", null]]) {
      const dst = path.join(tmp, dtype ?? "stored");
      const args = [path.join(hub, "pytorch_model.bin"), dst, ...(dtype ? ["--dtype", dtype] : [])];
      const r = run("convert", args);
      assert.match(r.stdout, /read \d+ tensors/);
      assert.ok(existsSync(path.join(dst, "model.safetensors")), readdirSync(dst).join(" "));
      assert.deepEqual([...safetensorsDtypes(path.join(dst, "model.safetensors"))], [want], `--dtype ${dtype}`);
      if (!existsSync(path.join(dst, "config.json"))) copyFileSync(path.join(hub, "config.json"), path.join(dst, "config.json"));
      const out = lines(run("generate", ["-m", dst, "-n", String(c.generate.max_new_tokens), "--logits", "--jsonl", "-"],
                            jsonl(c.prompts.map((ids) => ({ ids })))).stdout);
      out.forEach((o, b) => {
        if (tol === null) return;  // bf16 rounds the weights: only the shape of the contract
        const d = maxAbsDiff(o.logits, all.subarray((b * T + T - 1) * V, (b * T + T) * V));
        assert.ok(d <= tol, `${want} row ${b}: max |logits - golden| = ${d}`);
        assert.deepEqual(o.new_ids, c.generate.alone[b].new_tokens, `${want} row ${b}`);
      });
      assert.equal(out.length, B);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("opt-convert --quantize int8 / int4 / --packed: the stored packed format, the bits of quantizing at load / of the input", () => {
  const hub = path.join(FIX, "opt-tiny-preln-hubstyle");
  const c = gcase("opt-tiny-preln-hubstyle", "batch_left"), n = String(c.generate.max_new_tokens);
  const gen = (m, extra = []) => lines(run("generate", ["-m", m, "-n", n, "--logits", ...extra, "--jsonl", "-"], idsOf(c)).stdout);
  const tmp = mkdtempSync(path.join(OUT, "opt-convert-packed-"));
  try {
    // pytorch_model.bin in; sharded int8 out (as Model::load reads any of them), against --quantize int8 at load
    const q = path.join(tmp, "int8");
    const r = run("convert", [hub, q, "--quantize", "int8", "--max-shard-size", "20KB"]);
    assert.match(r.stdout, /read \d+ tensors \(pytorch\)/);
    assert.ok(existsSync(path.join(q, "model.safetensors.index.json")) && existsSync(path.join(q, "config.json")));
    const scheme = checkPacked(q, "I8");
    assert.equal(scheme["opt.weight_block"], "128");
    assert.equal(scheme["opt.lm_head_type"], "F16");  // the LM head as stored (the hub's F16), packed
    const want = gen(hub, ["--quantize", "int8"]);
    assert.deepEqual(gen(q), want, "stored int8 = quantized at load");
    assert.deepEqual(gen(q, ["--quantize", "int8"]), want, "--quantize int8 on an int8 folder: the same");
    // int4 likewise (32-column blocks)
    const q4 = path.join(tmp, "int4");
    run("convert", [hub, q4, "--quantize", "int4"]);
    assert.equal(checkPacked(q4, "I4")["opt.weight_block"], "32");
    assert.deepEqual(gen(q4), gen(hub, ["--quantize", "int4"]), "stored int4 = quantized at load");
    // --lm-head-int8, from a safetensors folder, one file
    const q8 = path.join(tmp, "int8-lm");
    run("convert", [path.join(FIX, "opt-tiny-preln"), q8, "--quantize", "int8", "--lm-head-int8"]);
    assert.ok(existsSync(path.join(q8, "model.safetensors")));
    assert.equal(checkPacked(q8, "I8")["opt.lm_head_type"], "I8");
    const g2 = (m, extra) => lines(run("generate", ["-m", m, "-n", "3", "--logits", ...extra, "--jsonl", "-"],
                                       idsOf(gcase("opt-tiny-preln", "batch_left"))).stdout);
    assert.deepEqual(g2(q8, []), g2(path.join(FIX, "opt-tiny-preln"), ["--quantize", "int8", "--lm-head-int8"]));
    // float panels: the bits of the normal load; --dtype bf16 --packed those of --dtype bf16
    const p = path.join(tmp, "packed");
    run("convert", [hub, p, "--packed"]);
    checkPacked(p, "F16");
    assert.deepEqual(gen(p), gen(hub));
    const pb = path.join(tmp, "packed-bf16"), b = path.join(tmp, "bf16");
    run("convert", [hub, pb, "--packed", "--dtype", "bf16"]);
    run("convert", [hub, b, "--dtype", "bf16"]);
    checkPacked(pb, "BF16");
    assert.deepEqual(gen(pb), gen(b));
    // a stored float folder is not quantized again at load
    const f = assertFails("generate", ["-m", p, "--quantize", "int8", "--jsonl", "-"], idsOf(c), "--quantize int8 on F16 panels");
    assert.match(f.stderr, /stored packed weights F16/);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("opt-make-random --dtype int8 / int4: the stored format shard by shard, the bits of --dtype bf16 quantized at load", () => {
  const tmp = mkdtempSync(path.join(OUT, "opt-random-int8-"));
  try {
    const q = path.join(tmp, "int8"), b = path.join(tmp, "bf16");
    run("make_random", [q, "--model", "125m", "--dtype", "int8", "--float-dtype", "bf16", "--max-shard-size", "100MB"]);
    run("make_random", [b, "--model", "125m", "--dtype", "bf16"]);
    const scheme = checkPacked(q, "I8");
    assert.equal(scheme["opt.lm_head_type"], "BF16");
    const index = JSON.parse(readFileSync(path.join(q, "model.safetensors.index.json"), "utf8"));
    const shards = [...new Set(Object.values(index.weight_map))];
    assert.ok(shards.length >= 3, `${shards.length} shards`);
    for (const s of shards) assert.ok(statSync(path.join(q, s)).size <= 100e6 + 64 * 1024, `${s} within 100MB`);
    assert.ok(index.weight_map["model.decoder.layers.11.fc2.weight.scales"]);
    assert.ok(index.weight_map["lm_head.weight.panels"]);
    const input = jsonl([{ ids: [2, 100, 200] }, { ids: [2, 5] }]);
    const a = lines(run("generate", ["-m", q, "-n", "3", "--logits", "--jsonl", "-"], input).stdout);
    const w = lines(run("generate", ["-m", b, "-n", "3", "--logits", "--quantize", "int8", "--jsonl", "-"], input).stdout);
    assert.deepEqual(a, w);
    const q4 = path.join(tmp, "int4");
    run("make_random", [q4, "--model", "125m", "--dtype", "int4", "--float-dtype", "bf16"]);
    checkPacked(q4, "I4");
    assert.deepEqual(lines(run("generate", ["-m", q4, "-n", "3", "--logits", "--jsonl", "-"], input).stdout),
                     lines(run("generate", ["-m", b, "-n", "3", "--logits", "--quantize", "int4", "--jsonl", "-"], input).stdout),
                     "random stored int4 = bf16 quantized to int4 at load");
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("opt-make-random: the published shapes; shards of at most --max-shard-size with an index, that load", () => {
  const list = run("make_random", ["--list"]).stdout.trim().split("\n").map((l) => l.split(" "));
  assert.deepEqual(list.map((l) => l[0]),
                   ["opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "opt-30b", "opt-66b"]);
  assert.deepEqual(list[1], ["opt-350m", "1024", "24", "16", "4096", "512", "post_ln"]);
  const tmp = mkdtempSync(path.join(OUT, "opt-random-"));
  try {
    const dir = path.join(tmp, "m");
    run("make_random", [dir, "--model", "125m", "--dtype", "bf16", "--max-shard-size", "100MB"]);
    const index = JSON.parse(readFileSync(path.join(dir, "model.safetensors.index.json"), "utf8"));
    const shards = [...new Set(Object.values(index.weight_map))].sort();
    assert.equal(shards.length, 3);
    assert.deepEqual(shards, [1, 2, 3].map((i) => `model-0000${i}-of-00003.safetensors`));
    assert.equal(index.metadata.total_size, 125239296 * 2);  // opt-125m's parameter count, 2 bytes each
    for (const s of shards) assert.ok(statSync(path.join(dir, s)).size <= 100e6 + 64 * 1024, `${s} within 100MB`);
    assert.equal(JSON.parse(readFileSync(path.join(dir, "config.json"), "utf8")).torch_dtype, "bfloat16");
    const out = lines(run("generate", ["-m", dir, "-n", "2", "--jsonl", "-"], jsonl([{ ids: [2, 100, 200] }])).stdout);
    assert.equal(out[0].new_ids.length, 2);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("exit codes: 0 on success (above); on any error exactly one line on stderr and a non-zero code", () => {
  const m = path.join(FIX, "opt-tiny-realvocab");
  const tmp = mkdtempSync(path.join(OUT, "opt-cli-"));
  try {
    writeFileSync(path.join(tmp, "config.json"), "{not json");
    const cases = [
      // (no input where the program fails before reading it)
      ["generate", ["-m", "/nonexistent/model", "--jsonl", "-"], "", "missing model"],
      ["generate", ["-m", tmp, "--jsonl", "-"], "", "bad config.json"],
      ["generate", ["-m", m, "--jsonl", "-"], "{not json\n", "malformed input line"],
      ["generate", ["-m", m, "--jsonl", "-"], '{"ids": [2, 1e3]}\n', "non-integer id"],
      ["generate", ["-m", m, "--jsonl", "-"], '{"ids": [2, 999999]}\n', "id out of range"],
      ["generate", ["-m", m, "--jsonl", "-"], "", "no input lines"],
      ["generate", ["-m", m, "-n", "100", "--jsonl", "-"], '{"ids": [2, 31414]}\n', "past the context"],
      ["generate", ["-m", m, "--jsonl", "/nonexistent.jsonl"], "", "unreadable --jsonl file"],
      ["generate", ["-m", m, "--padding", "middle", "--jsonl", "-"], "", "bad --padding"],
      ["generate", ["-m", m, "--kv-cache", "int8", "--jsonl", "-"], "", "bad --kv-cache"],
      ["generate", ["-m", m, "--no-such-flag"], "", "unknown flag"],
      ["generate", [], "", "no arguments"],
      ["tokenize", ["-t", TOKDIR, "--jsonl", "-"], "42\n", "not a string"],
      ["tokenize", ["-t", TOKDIR, "--jsonl", "-"], '"ok"\n{bad\n', "malformed line"],
      ["tokenize", ["-t", TOKDIR, "--decode", "--jsonl", "-"], '{"ids": [50270]}\n', "id the tokenizer lacks"],
      ["tokenize", ["-t", "/nonexistent", "--jsonl", "-"], "", "missing tokenizer"],
      ["tokenize", ["--jsonl", "-"], "", "no -t"],
      ["convert", ["/nonexistent/pytorch_model.bin", path.join(tmp, "o1")], "", "missing input"],
      ["convert", [path.join(tmp, "config.json"), path.join(tmp, "o2")], "", "not a checkpoint"],
      ["convert", [path.join(FIX, "opt-tiny-preln-hubstyle"), path.join(tmp, "o3"), "--dtype", "f8"], "", "bad --dtype"],
      ["convert", [], "", "no arguments"],
      ["convert", [path.join(FIX, "opt-tiny-preln-hubstyle"), path.join(tmp, "o4"), "--max-shard-size", "5XB"], "",
       "bad --max-shard-size"],
      ["make_random", [path.join(tmp, "r1"), "--model", "opt-7b"], "", "unknown --model"],
      ["make_random", [path.join(tmp, "r2"), "--dtype", "int3"], "", "bad --dtype"],
      ["make_random", [path.join(tmp, "r3"), "--max-shard-size", "lots"], "", "bad --max-shard-size"],
      ["make_random", [path.join(tmp, "r4"), "--dtype", "int8", "--float-dtype", "i8"], "", "bad --float-dtype"],
      ["convert", [path.join(FIX, "opt-tiny-preln"), path.join(tmp, "o5"), "--quantize", "int3"], "", "bad --quantize"],
      ["convert", [path.join(FIX, "opt-tiny-preln"), path.join(tmp, "o7"), "--lm-head-int8"], "",
       "--lm-head-int8 without the packed format"],
      ["make_random", [], "", "no folder"],
    ];
    for (const [prog, args, input, what] of cases) assertFails(prog, args, input, `${prog}: ${what}`);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
