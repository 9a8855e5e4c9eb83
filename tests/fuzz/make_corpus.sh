#!/usr/bin/env bash
# Seed corpora for the fuzz targets, generated from ../shared (never copied into the repository).
#   tests/fuzz/make_corpus.sh [OUT_DIR [SHARED_DIR]]     (defaults: build-fuzz/corpus, ../shared)
# Writes OUT_DIR/<target>/ for every fuzz_<target>. Needs python3 (standard library only).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build-fuzz/corpus}
shared=${2:-${OPT_FUZZ_SHARED_DIR:-$root/../shared}}
[ -f "$shared/fixtures/manifest.json" ] || { echo "make_corpus.sh: no fixtures under $shared" >&2; exit 1; }
mkdir -p "$out"
python3 - "$out" "$shared" <<'PY'
import json, os, struct, sys, zipfile
out, shared = sys.argv[1], sys.argv[2]
fx = os.path.join(shared, "fixtures")
def put(target, name, data):
    d = os.path.join(out, target); os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f: f.write(data if isinstance(data, bytes) else data.encode())
def st_file(tensors, metadata=None):
    h, off, body = {}, 0, b""
    if metadata is not None: h["__metadata__"] = metadata
    for name, dt, shape, data in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data); body += data
    j = json.dumps(h).encode()
    j += b" " * (-len(j) % 8)
    return struct.pack("<Q", len(j)) + j + body
models = sorted(m["dir"] for m in json.load(open(os.path.join(fx, "manifest.json")))["models"])
for m in models:
    d = os.path.join(fx, m)
    put("config", m + ".json", open(os.path.join(d, "config.json"), "rb").read())
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx): put("index", m + ".json", open(idx, "rb").read())
    st = os.path.join(d, "model.safetensors")
    if not os.path.exists(st): continue
    raw = open(st, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    # safetensors: the first few tensors of each fixture, re-laid out (small seeds mutate faster)
    ts = []
    for k, v in list((k, v) for k, v in hdr.items() if k != "__metadata__")[:4]:
        b, e = v["data_offsets"]; ts.append((k, v["dtype"], v["shape"], data[b:e][:256]))
        # keep shape consistent with the truncated data: flatten to 1-D
        size = {"F32": 4, "F16": 2, "BF16": 2}.get(v["dtype"], 4)
        ts[-1] = (k, v["dtype"], [len(ts[-1][3]) // size], ts[-1][3][: (len(ts[-1][3]) // size) * size])
    put("safetensors", m + ".safetensors", st_file(ts, hdr.get("__metadata__")))
    # model: whole files that fit the configs fuzz_model tries (preln in every dtype and prefix, postln-proj, odd,
    # gelu-nobias, nofinalln-silu)
    if m in ("opt-tiny-preln", "opt-tiny-preln-fp16", "opt-tiny-preln-bf16", "opt-tiny-preln-hubstyle",
             "opt-tiny-postln-proj", "opt-tiny-odd", "opt-tiny-gelu-nobias", "opt-tiny-nofinalln-silu"):
        put("model", m + ".safetensors", raw)
put("safetensors", "empty.safetensors", st_file([]))
put("safetensors", "dtypes.safetensors", st_file([(dt, dt, [2, 1], b"\x01" * (2 * sz)) for dt, sz in
    [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1), ("U8", 1),
     ("BOOL", 1), ("F8_E4M3", 1), ("F8_E5M2", 1)]] + [("scalar", "F32", [], b"\0\0\x80\x3f"),
     ("zero", "F32", [0, 3], b"")], {"format": "pt"}))
put("index", "small.json", json.dumps({"metadata": {"total_size": 16}, "weight_map": {"a": "s1.safetensors",
    "b": "s2.safetensors", "c": "s1.safetensors"}}))
put("config", "minimal.json", json.dumps({"model_type": "opt", "vocab_size": 10, "hidden_size": 4,
    "num_attention_heads": 2, "num_hidden_layers": 1, "ffn_dim": 8, "max_position_embeddings": 4,
    "word_embed_proj_dim": None, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}))
# tokenizer: a small but real slice of the OPT vocabulary: every byte token, the specials, and the merges
# (in order) whose parts and result are all kept.
tok = os.path.join(shared, "tokenizer")
vocab = json.load(open(os.path.join(tok, "vocab.json"), encoding="utf-8"))
merges = [l for l in open(os.path.join(tok, "merges.txt"), encoding="utf-8").read().split("\n")[1:] if l]
keep = {k: v for k, v in vocab.items() if v < 300}
kept_merges = []
for l in merges:
    a, b = l.split(" ")
    if a in keep and b in keep and (a + b) in vocab and len(kept_merges) < 400:
        keep[a + b] = vocab[a + b]; kept_merges.append(l)
for k in ("<s>", "<pad>", "</s>", "<unk>"):
    keep[k] = vocab[k]
ids = {v: i for i, v in enumerate(sorted(set(keep.values())))}
small = {k: ids[v] for k, v in keep.items()}  # dense ids
merges_txt = "#version: 0.2\n" + "\n".join(kept_merges) + "\n"
put("tokenizer_blobs", "small", json.dumps(small, ensure_ascii=False).encode() + b"\0" + merges_txt.encode())
put("tokenizer_blobs", "tiny", json.dumps({"a": 0, "b": 1, "ab": 2, "</s>": 3}).encode() + b"\0" + b"a b\n")
tj = {"version": "1.0", "truncation": None, "padding": None,
      "added_tokens": [{"id": small[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                        "normalized": True, "special": True} for t in ("<s>", "<pad>", "</s>", "<unk>")],
      "normalizer": None,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
      "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", small["</s>"]], "cls": ["<s>", small["<s>"]],
                         "trim_offsets": True, "add_prefix_space": False},
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": small,
                "merges": kept_merges}}
put("tokenizer_json", "small.json", json.dumps(tj, ensure_ascii=False))
tj2 = dict(tj); tj2["model"] = dict(tj["model"]); tj2["model"]["merges"] = [l.split(" ") for l in kept_merges]
tj2["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "</s>", "type_id": 0}},
    {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"</s>": {"id": "</s>",
    "ids": [small["</s>"]], "tokens": ["</s>"]}}}
put("tokenizer_json", "template_pairs.json", json.dumps(tj2, ensure_ascii=False))
# encode: text from the tokenizer goldens; decode: id lists from them (flags byte + 3 bytes per id)
g = json.load(open(os.path.join(tok, "tok_goldens.json"), encoding="utf-8"))
def walk(x, strs, lists):
    if isinstance(x, str): strs.append(x)
    elif isinstance(x, list):
        if x and all(isinstance(i, int) for i in x): lists.append(x)
        else:
            for i in x: walk(i, strs, lists)
    elif isinstance(x, dict):
        for v in x.values(): walk(v, strs, lists)
strs, lists = [], []
walk(g, strs, lists)
for i, s in enumerate(dict.fromkeys(strs)):
    if len(s.encode()) <= 4096: put("encode", "g%03d" % i, s.encode())
for i, l in enumerate(lists[:60]):
    put("decode", "g%03d" % i, bytes([i % 4]) + b"".join(struct.pack("<I", v % 50280)[:3] for v in l))
# tokenizer_config: tokenizer_config.json NUL special_tokens_map.json (the real OPT config from the goldens)
tc = g["tokenizer"]["tokenizer_config"]
put("tokenizer_config", "opt.json", json.dumps(tc))
put("tokenizer_config", "opt_with_map.json", json.dumps(tc).encode() + b"\0" + json.dumps(
    {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}).encode())
put("tokenizer_config", "fields.json", json.dumps({"add_bos_token": False, "add_prefix_space": True,
    "added_tokens_decoder": {"1": {"content": "<pad>", "special": True, "lstrip": False, "rstrip": False},
                             "16": {"content": "<new>", "special": False, "lstrip": True, "rstrip": True}},
    "bos_token": {"content": "<s>"}, "pad_token": None, "additional_special_tokens": ["<x>", {"content": "<y>"}]}))
# serve_request: request bodies for both endpoints (fields, types and limits of examples/opt_serve/request.hpp)
bodies = [
    {"prompts": ["Hello, my dog is cute", "The capital of France is"], "max_new_tokens": 10},
    {"prompts": ["a"]}, {"prompts": [], "max_new_tokens": 5}, {"prompts": ["x" * 300], "max_new_tokens": 60},
    {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
    {"prompt": ["one", "two"], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7},
    {"prompt": [2, 31414, 232, 328], "max_tokens": 3, "echo": True, "stop": ["\n", "."]},
    {"prompt": [[2, 100], [2, 200, 300]], "stream": True, "stream_options": {"include_usage": True}},
    {"model": "opt", "prompt": "hi", "n": 1, "best_of": 1, "logprobs": 0, "presence_penalty": 0,
     "frequency_penalty": 0, "logit_bias": {}, "repetition_penalty": 1.3, "stop": "the", "suffix": None},
    {"prompt": "\u00e9\u4e2d\U0001F600 <s></s>", "max_tokens": 1.0, "seed": -9223372036854775808},
    {"prompt": "x", "max_tokens": 18446744073709551615, "top_k": 1e300, "temperature": -0.0},
    {"prompts": ["a"], "speculative": False}, {"prompt": "a", "speculative": "no"},
]
for i, b in enumerate(bodies): put("serve_request", "b%02d.json" % i, json.dumps(b, ensure_ascii=(i % 2 == 0)))
put("serve_request", "not_object.json", "[1, 2]")
# pytorch: the hub-style torch.save archive, and its data.pkl for the unpickler
pt = os.path.join(fx, "opt-tiny-preln-hubstyle", "pytorch_model.bin")
if os.path.exists(pt):
    put("pytorch_zip", "hubstyle.bin", open(pt, "rb").read())
    z = zipfile.ZipFile(pt)
    for n in z.namelist():
        if n.endswith("/data.pkl"): put("unpickle", "hubstyle.pkl", z.read(n))
PY
for t in "$here"/fuzz_*.cpp; do t=$(basename "$t" .cpp); mkdir -p "$out/${t#fuzz_}"; done
echo "make_corpus.sh: seeds in $out: $(find "$out" -type f | wc -l) files"
