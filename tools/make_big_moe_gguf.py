# A GGUF bigger than RAM for the bigger-than-RAM runs: Qwen3-235B-A22B's width (hidden 4096, 64
# heads of 128, 4 KV heads, 128 experts of 1536, top-8) cut to --layers layers, qwen3moe names, Q8_0
# blocks written directly (random int8 codes, one block scale; no bf16 step), the file's pages
# dropped from the page cache at the end. One random tensor per role serves every layer (routing
# stays per layer: each router is its own). Needs numpy and gguf-py (--gguf-py DIR).
# usage: python3 tools/make_big_moe_gguf.py --gguf-py ../shared/peers/gguf-py --out big.gguf --layers 21
import sys, os, time, argparse
import numpy as np
ap = argparse.ArgumentParser()
ap.add_argument("--gguf-py", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--layers", type=int, default=24)
a = ap.parse_args()
sys.path.insert(0, a.gguf_py)
import gguf
H, L, NH, NKV, HD, E, K, FF, V = 4096, a.layers, 64, 4, 128, 128, 8, 1536, 32000
rng = np.random.default_rng(7)
Q8 = gguf.GGMLQuantizationType.Q8_0
def q8(rows, cols, std=0.02):
    assert cols % 32 == 0
    nb = rows * cols // 32
    blk = np.empty((nb, 34), dtype=np.uint8)
    blk[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
    d = np.full(nb, std / 73.0, dtype=np.float16)
    blk[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return blk.reshape(rows, cols // 32 * 34)
def f32(shape, ones=False, std=0.02):
    return np.ones(shape, np.float32) if ones else (rng.standard_normal(shape).astype(np.float32) * std)
t0 = time.time()
w = gguf.GGUFWriter(a.out, "qwen3moe")
w.add_name("qwen3moe-235b-width-random")
w.add_context_length(8192); w.add_embedding_length(H); w.add_block_count(L)
w.add_feed_forward_length(12288); w.add_expert_feed_forward_length(FF)
w.add_head_count(NH); w.add_head_count_kv(NKV); w.add_key_length(HD); w.add_value_length(HD)
w.add_rope_freq_base(1000000.0); w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(E); w.add_expert_used_count(K)
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~")+1)) + list(range(ord("¡"), ord("¬")+1)) + list(range(ord("®"), ord("ÿ")+1))
    cs = bs[:]; n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256+n); n += 1
    return [chr(c) for c in cs]
toks = bytes_to_unicode() + ["Ġt", "Ġa", "he", "in"]
while len(toks) < V - 1:
    toks.append(f"<x{len(toks)}>")
toks.append("<|endoftext|>")
w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default")
w.add_token_list(toks); w.add_token_types([gguf.TokenType.NORMAL] * (V - 1) + [gguf.TokenType.CONTROL])
w.add_token_merges(["Ġ t", "Ġ a", "h e", "i n"]); w.add_bos_token_id(V - 1); w.add_eos_token_id(V - 1)
def put(name, arr, shape=None):
    if shape is None:
        w.add_tensor(name, arr)
    else:
        w.add_tensor(name, arr, raw_dtype=Q8)  # arr's shape is the byte shape
put("token_embd.weight", q8(V, H), (V, H))
wq, wk, wv, wo = q8(NH * HD, H), q8(NKV * HD, H), q8(NKV * HD, H), q8(H, NH * HD)
eg, eu, ed = q8(E * FF, H), q8(E * FF, H), q8(E * H, FF)
norm_h, norm_d = f32((H,), ones=True), f32((HD,), ones=True)
for i in range(L):
    p = f"blk.{i}."
    put(p + "attn_norm.weight", norm_h)
    put(p + "attn_q.weight", wq, (NH * HD, H)); put(p + "attn_k.weight", wk, (NKV * HD, H)); put(p + "attn_v.weight", wv, (NKV * HD, H))
    put(p + "attn_output.weight", wo, (H, NH * HD))
    put(p + "attn_q_norm.weight", norm_d); put(p + "attn_k_norm.weight", norm_d)
    put(p + "ffn_norm.weight", norm_h)
    put(p + "ffn_gate_inp.weight", f32((E, H), std=0.05))
    put(p + "ffn_gate_exps.weight", eg.reshape(E, FF, H // 32 * 34), (E, FF, H))
    put(p + "ffn_up_exps.weight", eu.reshape(E, FF, H // 32 * 34), (E, FF, H))
    put(p + "ffn_down_exps.weight", ed.reshape(E, H, FF // 32 * 34), (E, H, FF))
put("output_norm.weight", norm_h)
put("output.weight", q8(V, H), (V, H))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=False); w.close()
fd = os.open(a.out, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
print(f"wrote {a.out} {os.path.getsize(a.out)/1e9:.3f} GB in {time.time()-t0:.1f}s", flush=True)
