#!/usr/bin/env python3
"""Re-derive the fixtures' oracle logits with a from-scratch NumPy float64 forward pass.

This is a second, independent reading of each checkpoint (it uses neither torch nor
transformers): it reads model.safetensors / config.json (or the GGUF's raw tensors)
directly and implements the math the Rust engine implements. Agreement with
oracle.json shows that the tensor names, layouts and formulas described in
tests/fixtures/README.md are the ones the oracle used. For SmolLM2 it runs on the GGUF's
raw (not un-permuted) attn_q/attn_k rows with interleaved RoPE pairs (2i, 2i+1), the
way an engine reading the GGUF directly must.

Usage (from the repository root; needs numpy, and the gguf package for smollm2):

    ~/.venvs/oracle/bin/python tools/check_fixtures.py                # everything
    ~/.venvs/oracle/bin/python tools/check_fixtures.py llama pymoe    # some fixtures
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PYMOE_DIR = ROOT.parent / "shared" / "models" / "pymoe-22m"
SMOLLM2_GGUF = Path.home() / ".cache/coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = ["llama", "llama_tied", "olmoe", "qwen3_moe", "mixtral"]


def load_safetensors(path):
    """Minimal safetensors reader: F32 and BF16 tensors as float64 arrays."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        buf = raw[base + a:base + b]
        if meta["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif meta["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(meta["dtype"])
        out[name] = arr.reshape(meta["shape"]).astype(np.float64)
    return out


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def rope(x, theta, interleaved):
    """x: [T, heads, hd]. Half-split pairs (i, i+hd/2), or adjacent pairs (2i, 2i+1)."""
    t, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def forward(W, c, ids, arch, interleaved_rope=False):
    """Logits [T, vocab]. W: HF tensor names -> float64 arrays; c: config dict."""
    eps = c["rms_norm_eps"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    theta = c["rope_parameters"]["rope_theta"]
    T = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if arch == "olmoe":  # norm over the whole projection, before splitting heads
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if arch == "qwen3_moe":  # norm per head over head_dim
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, theta, interleaved_rope), rope(k, theta, interleaved_rope)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kv].T / np.sqrt(hd) + mask
            att[:, hh] = softmax(s) @ v[:, kv]
        x = x + att.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        if arch == "llama":
            m = p + "mlp."
            y = (silu(h @ W[m + "gate_proj.weight"].T) * (h @ W[m + "up_proj.weight"].T)) @ W[m + "down_proj.weight"].T
        else:
            if arch == "mixtral":
                m, names, renorm = p + "block_sparse_moe.", ("w1", "w3", "w2"), True
                n_exp = c["num_local_experts"]
            else:
                m, names, renorm = p + "mlp.", ("gate_proj", "up_proj", "down_proj"), c["norm_topk_prob"]
                n_exp = c.get("num_experts") or c["num_local_experts"]  # transformers 5 writes num_local_experts for qwen3_moe
            probs = softmax(h @ W[m + "gate.weight"].T)
            top = np.argsort(-probs, axis=-1, kind="stable")[:, : c["num_experts_per_tok"]]
            y = np.zeros_like(h)
            for t in range(T):
                w = probs[t, top[t]]
                if renorm:
                    w = w / w.sum()
                for e, we in zip(top[t], w):
                    assert e < n_exp
                    g, u, d = (W[f"{m}experts.{e}.{n}.weight"] for n in names)
                    y[t] += we * ((silu(h[t] @ g.T) * (h[t] @ u.T)) @ d.T)
        x = x + y
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight")
    if head is None:
        assert c.get("tie_word_embeddings"), "no lm_head.weight but embeddings not tied"
        head = W["model.embed_tokens.weight"]
    return x @ head.T


def report(name, got, want, max_abs, tol_rel=1e-4):
    err = float(np.abs(got - np.asarray(want)).max())
    ok = err <= tol_rel * max_abs
    print(f"[{name}] max |numpy - oracle| = {err:.3e} (limit {tol_rel * max_abs:.3e}) {'OK' if ok else 'FAIL'}")
    return ok


def check_tiny(name):
    d = FIXTURES / name
    c = json.loads((d / "config.json").read_text())
    o = json.loads((d / "oracle.json").read_text())
    W = load_safetensors(d / "model.safetensors")
    arch = {"llama": "llama", "olmoe": "olmoe", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral"}[c["model_type"]]
    ids = o["prompt_ids"] + o["greedy"][:-1]
    logits = forward(W, c, ids, arch)
    n = len(o["prompt_ids"])
    ok = report(name + " prompt", logits[:n], o["logits"], o["max_abs_logit"])
    ok &= report(name + " greedy rows", logits[n - 1:], o["greedy_logits"], o["max_abs_logit"])
    same = [int(a) for a in logits[n - 1:].argmax(-1)] == o["greedy"]
    print(f"[{name}] greedy ids {'identical' if same else 'DIFFER'}")
    return ok and same


def check_pymoe():
    c = json.loads((PYMOE_DIR / "config.json").read_text())
    o = json.loads((FIXTURES / "pymoe_ref" / "oracle.json").read_text())
    W = load_safetensors(PYMOE_DIR / "model.safetensors")
    ok = True
    for p in o["prompts"]:
        ids = p["prompt_ids"] + p["greedy"][:-1]
        logits = forward(W, c, ids, "olmoe")
        n = len(p["prompt_ids"])
        ok &= report("pymoe " + repr(p["text"][:20]), logits[:n], p["logits"], o["max_abs_logit"])
        same = [int(a) for a in logits[n - 1:].argmax(-1)] == p["greedy"]
        print(f"[pymoe] greedy ids {'identical' if same else 'DIFFER'}")
        ok &= same
    return ok


def check_smollm2():
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(SMOLLM2_GGUF))

    def field(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return v.tolist()[0] if v.dtype != np.uint8 else bytes(v).decode()

    c = {
        "rms_norm_eps": field("llama.attention.layer_norm_rms_epsilon"),
        "num_attention_heads": field("llama.attention.head_count"),
        "num_key_value_heads": field("llama.attention.head_count_kv"),
        "hidden_size": field("llama.embedding_length"),
        "num_hidden_layers": field("llama.block_count"),
        "rope_parameters": {"rope_theta": field("llama.rope.freq_base")},
        "tie_word_embeddings": True,
    }
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    sub = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
           "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    W = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            hf = f"model.layers.{parts[1]}.{sub[parts[2]]}.weight"
        else:
            hf = names[parts[0]] + ".weight"
        shape = tuple(reversed([int(s) for s in t.shape]))
        W[hf] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
    o = json.loads((FIXTURES / "smollm2_ref" / "oracle.json").read_text())
    ok = True
    for p in o["prompts"]:
        ids = p["prompt_ids"] + p["greedy"][:-1]
        logits = forward(W, c, ids, "llama", interleaved_rope=True)
        n = len(p["prompt_ids"])
        ok &= report("smollm2 " + repr(p["text"][:20]), logits[n - 1], p["last_logits"], o["max_abs_logit"])
        # top20: the listed logits must match, and any id the two sides rank differently must be a near tie.
        tol = 1e-4 * o["max_abs_logit"]
        top_ok = True
        for row, want in zip(logits[:n], p["top20"]):
            ids_w = [i for i, _ in want]
            top_ok &= all(abs(row[i] - v) <= tol for i, v in want)
            mine = [int(i) for i in np.argsort(-row, kind="stable")[:20]]
            for i in set(mine) ^ set(ids_w):
                top_ok &= abs(row[i] - want[-1][1]) <= tol
        print(f"[smollm2] top-20 at every prompt position {'agree' if top_ok else 'DIFFER'}")
        ok &= top_ok
        same = [int(a) for a in logits[n - 1:].argmax(-1)] == p["greedy"]
        print(f"[smollm2] greedy ids {'identical' if same else 'DIFFER'}")
        ok &= same
    return ok


def main(argv):
    targets = argv or TINY + ["pymoe", "smollm2"]
    ok = True
    for t in targets:
        if t in TINY:
            ok &= check_tiny(t)
        elif t == "pymoe":
            ok &= check_pymoe()
        elif t == "smollm2":
            ok &= check_smollm2()
        else:
            raise SystemExit(f"unknown fixture {t!r}")
    print("all fixtures agree" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
