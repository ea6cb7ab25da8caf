#!/usr/bin/env python3
"""A Llama-3.1-8B-geometry GGUF whose every matrix is random blocks of one block type, written
directly (no bf16 file, no quantizer run: seconds instead of minutes on the GPU machine), for
speed runs of coli and llama.cpp on the same file; the values mean nothing. The block scales are
small so that activations stay finite. llama.cpp loads it (a byte-level vocabulary of the
geometry's size with a few merges).

usage: python3 tools/make_random_gguf.py GGUF_PY_DIR OUT.gguf IQ4_XS|Q8_0
"""
import sys, os, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import gguf
out, typ = sys.argv[2], sys.argv[3]
H, L, NH, NKV, FF, V, THETA = 4096, 32, 32, 8, 14336, 128256, 500000.0
HD = H // NH
T = getattr(gguf.GGMLQuantizationType, typ)
rng = np.random.default_rng(0)
def blocks(rows, cols):
    if typ == "IQ4_XS":
        n = cols // 256
        b = rng.integers(0, 256, size=(rows, n, 136), dtype=np.uint8)
        d = np.full((rows, n), 2e-5, dtype=np.float16).view(np.uint8).reshape(rows, n, 2)
        b[:, :, 0:2] = d
    elif typ == "Q8_0":
        n = cols // 32
        b = rng.integers(0, 256, size=(rows, n, 34), dtype=np.uint8)
        b[:, :, 0:2] = np.full((rows, n), 1e-3, dtype=np.float16).view(np.uint8).reshape(rows, n, 2)
    else:
        raise SystemExit(typ)
    return b.reshape(rows, -1)
t0 = time.time()
w = gguf.GGUFWriter(out, "llama")
w.add_name("llama-random-geometry")
w.add_context_length(8192); w.add_embedding_length(H); w.add_block_count(L); w.add_feed_forward_length(FF)
w.add_head_count(NH); w.add_head_count_kv(NKV); w.add_rope_freq_base(THETA); w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(HD)
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~")+1)) + list(range(ord("\u00a1"), ord("\u00ac")+1)) + list(range(ord("\u00ae"), ord("\u00ff")+1))
    cs = bs[:]; n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256+n); n += 1
    return [chr(c) for c in cs]
toks = bytes_to_unicode() + ["\u0120t", "\u0120a", "he", "in"]
toks += [f"<x{i}>" for i in range(len(toks), V - 1)] + ["<|endoftext|>"]
w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default"); w.add_token_list(toks)
w.add_token_types([gguf.TokenType.NORMAL] * (V - 1) + [gguf.TokenType.CONTROL])
w.add_token_merges(["\u0120 t", "\u0120 a", "h e", "i n"])
w.add_bos_token_id(V - 1); w.add_eos_token_id(V - 1)
def put(name, rows, cols):
    w.add_tensor(name, blocks(rows, cols), raw_dtype=T)
def norm(name):
    w.add_tensor(name, np.ones(H, dtype=np.float32))
put("token_embd.weight", V, H)
for i in range(L):
    p = f"blk.{i}."
    norm(p + "attn_norm.weight"); norm(p + "ffn_norm.weight")
    put(p + "attn_q.weight", H, H); put(p + "attn_k.weight", NKV * HD, H); put(p + "attn_v.weight", NKV * HD, H)
    put(p + "attn_output.weight", H, H)
    put(p + "ffn_gate.weight", FF, H); put(p + "ffn_up.weight", FF, H); put(p + "ffn_down.weight", H, FF)
norm("output_norm.weight")
put("output.weight", V, H)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=False); w.close()
print(f"wrote {out} {os.path.getsize(out)/1e9:.2f} GB in {time.time()-t0:.1f}s", flush=True)
