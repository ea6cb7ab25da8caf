#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz.rs under tests/fuzz/corpus/: a tiny llama GGUF (v3,
metadata with a byte-level BPE vocabulary and merges, F32/F16/Q8_0 tensors), a tiny safetensors
checkpoint (a header and config.json), spec expressions, tokenizer.json files and chat templates
(copied from runtime/tests/data). No dependencies beyond the standard library; the output is
deterministic, so re-running it changes nothing unless this script changed."""
import json, os, struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(v):
    if isinstance(v, bool):
        return struct.pack("<I", 7) + struct.pack("<?", v)
    if isinstance(v, int):
        return struct.pack("<I", 4) + struct.pack("<I", v)
    if isinstance(v, float):
        return struct.pack("<I", 6) + struct.pack("<f", v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + gguf_string(v)
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(gguf_string(x) for x in v)
        if all(isinstance(x, float) for x in v):
            return struct.pack("<IIQ", 9, 6, len(v)) + b"".join(struct.pack("<f", x) for x in v)
        return struct.pack("<IIQ", 9, 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    raise TypeError(v)


def tiny_gguf():
    hidden, ffn, vocab_letters = 8, 16, "abcdefghij"
    tokens = ["<s>", "</s>"] + list(vocab_letters) + ["ab", "cd", "abcd"]
    merges = ["a b", "c d", "ab cd"]
    kv = {
        "general.architecture": "llama",
        "general.alignment": 32,
        "llama.block_count": 1,
        "llama.context_length": 64,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 2),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}",
    }
    n_vocab, head_dim = len(tokens), hidden // 2
    shapes = {  # GGUF order: innermost first
        "token_embd.weight": ([hidden, n_vocab], 0),
        "output_norm.weight": ([hidden], 0),
        "blk.0.attn_norm.weight": ([hidden], 0),
        "blk.0.attn_q.weight": ([hidden, hidden], 1),
        "blk.0.attn_k.weight": ([hidden, head_dim], 1),
        "blk.0.attn_v.weight": ([hidden, head_dim], 0),
        "blk.0.attn_output.weight": ([hidden, hidden], 0),
        "blk.0.ffn_norm.weight": ([hidden], 0),
        "blk.0.ffn_gate.weight": ([hidden, ffn], 0),
        "blk.0.ffn_up.weight": ([hidden, ffn], 0),
        "blk.0.ffn_down.weight": ([ffn, hidden], 0),
    }
    infos, data = b"", b""
    for i, (name, (dims, ty)) in enumerate(shapes.items()):
        n = 1
        for d in dims:
            n *= d
        vals = [((i * 31 + j * 7) % 17 - 8) / 16.0 for j in range(n)]
        if "norm" in name:
            vals = [1.0] * n
        raw = struct.pack(f"<{n}f", *vals) if ty == 0 else struct.pack(f"<{n}e", *vals)
        data += b"\0" * ((-len(data)) % 32)
        infos += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ty, len(data))
        data += raw
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(kv))
    head += b"".join(gguf_string(k) + gguf_value(v) for k, v in kv.items()) + infos
    head += b"\0" * ((-len(head)) % 32)
    return head + data


def tiny_safetensors():
    tensors = {"model.embed_tokens.weight": ("F32", [4, 2]), "model.norm.weight": ("BF16", [2])}
    header, data = {}, b""
    for name, (dt, shape) in tensors.items():
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        raw = struct.pack(f"<{n}f", *([0.5] * n)) if dt == "F32" else b"\x80\x3f" * n
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    write("gguf", "tiny_llama.gguf", tiny_gguf())
    write("safetensors", "tiny.safetensors", tiny_safetensors())
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2, "num_hidden_layers": 1, "vocab_size": 4}
    write("safetensors_config", "config.json", json.dumps(cfg, indent=1))
    exprs = ["hidden / heads", "1.0 / sqrt(head_dim)", "!contains(mlp_only, i) && (i + 1) % step == 0",
             "max(1, experts - 2) * 3", "min(a, b) + (c - d) * e", "i >= first && i < last || x == 2"]
    for k, e in enumerate(exprs):
        write("expr", f"e{k}.txt", e)
    write("tokenizer", "bpe_byte_level.json", json.dumps(tiny_tokenizer(), indent=1))
    data = os.path.join(ROOT, "runtime", "tests", "data")
    with open(os.path.join(data, "chat_templates.json")) as f:
        templates = sorted({r["template"] for r in json.load(f)["renderings"]})
    for k, t in enumerate(templates):
        write("chat_template", f"t{k}.jinja", t)


def tiny_tokenizer():
    """A byte-level BPE tokenizer.json of twenty tokens, two of them special."""
    vocab = {t: i for i, t in enumerate(["<s>", "</s>"] + list("abcdefgh\u0120.") + ["ab", "cd", "abcd", "\u0120a"])}
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(["<s>", "</s>"])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": ["a b", "c d", "ab cd", "\u0120 a"]}}

if __name__ == "__main__":
    main()
