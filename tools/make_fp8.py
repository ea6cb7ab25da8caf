#!/usr/bin/env python3
"""Writes coli's FP8 (E4M3 with 128 x 128 block scales) test data, with numpy only:

- runtime/tests/data/fp8_vectors.json: every E4M3 code's value, decoded here from its bit
  fields in float64 (null for the two NaN codes), and one FP8_E4M3 row (coli's block form:
  per 128 elements an f32 scale then 128 codes) with its values, for the Rust format tests.
- tests/fixtures/fp8_olmoe/: a tiny OLMoE checkpoint laid out as the published FP8 checkpoints
  are (DeepSeek-V3/R1, GLM-4.5, Kimi K2, MiMo: `quantization_config` with `weight_block_size`
  [128, 128]): every linear weight of the layers stored `F8_E4M3` [out, in] with its
  `weight_scale_inv` [ceil(out/128), ceil(in/128)] (F32 in layer 0, BF16 in layer 1), the
  embeddings, norms, router and lm_head BF16; per-expert tensors. The oracle (oracle.json) is
  the from-scratch float64 forward of tools/check_fixtures.py over the DEQUANTIZED weights
  (`e4m3(q) * scale`), so coli, which multiplies the blocks without expanding them, must agree
  within f32 rounding.

The encoder rounds to nearest, ties to even, and saturates at 448 (scales are amax / 448, so
nothing saturates but the amax itself). Deterministic (fixed seed). Run from anywhere:

    python3 tools/make_fp8.py
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from check_fixtures import forward  # noqa: E402  (numpy float64 forward, no torch)

VECTORS = ROOT / "runtime" / "tests" / "data" / "fp8_vectors.json"
FIXTURE = ROOT / "tests" / "fixtures" / "fp8_olmoe"
BLOCK = 128


def e4m3_decode(codes):
    """float64 values of uint8 E4M3 ("fn") codes: bias 7, subnormals m/8 * 2^-6, NaN 0x7f/0xff."""
    c = np.asarray(codes, dtype=np.int64)
    sign = np.where(c >> 7 == 1, -1.0, 1.0)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return np.where((e == 15) & (m == 7), np.nan, sign * mag)


def e4m3_encode(x):
    """uint8 E4M3 codes nearest to float64 `x` (ties to even), saturating at +-448."""
    x = np.asarray(x, dtype=np.float64)
    sign = np.signbit(x).astype(np.int64) << 7
    a = np.minimum(np.abs(x), 448.0)
    # Subnormals and the smallest normals share the step 2^-9: code m is m * 2^-9 for m <= 8.
    sub = np.rint(a / 2.0 ** -9).astype(np.int64)
    _, ex = np.frexp(np.where(a > 0, a, 1.0))  # a = f * 2^ex, f in [0.5, 1)
    e = ex - 1  # a in [2^e, 2^(e+1))
    m = np.rint((a / 2.0 ** e - 1.0) * 8.0).astype(np.int64)
    carry = m == 8
    e, m = np.where(carry, e + 1, e), np.where(carry, 0, m)
    normal = ((e + 7) << 3) | m
    code = np.where(a < 2.0 ** -6, sub, normal)
    return (np.minimum(code, 0x7E) | sign).astype(np.uint8)


def check_codec():
    codes = np.arange(256)
    vals = e4m3_decode(codes)
    finite = ~np.isnan(vals)
    back = e4m3_encode(vals[finite])
    # -0.0 encodes as 0x80 (the sign bit is kept), so every finite code round-trips.
    assert (back == codes[finite]).all(), "every finite code encodes to itself"
    mids = (vals[1:0x7E] + vals[2:0x7F]) / 2  # halfway between neighbours: ties to even
    got = e4m3_encode(mids)
    assert all(int(g) in (i, i + 1) and int(g) % 2 == 0 for i, g in zip(range(1, 0x7E), got))
    assert e4m3_encode([1000.0, -1000.0]).tolist() == [0x7E, 0xFE]


def f32_bits(v):
    return np.asarray(v, dtype="<f4").tobytes()


def bf16_round(x):
    """float32 values rounded to bfloat16 (nearest, ties to even), as uint16 bits."""
    b = np.asarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype("<u2")


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_vectors():
    values = [None if np.isnan(v) else float(v) for v in e4m3_decode(np.arange(256))]
    # One row of two blocks: every code (NaNs replaced by zero) under two f32 scales.
    codes = np.arange(256, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    scales = np.array([0.0123456, 3.75], dtype=np.float32)
    row = b"".join(f32_bits(scales[b]) + codes[b * BLOCK:(b + 1) * BLOCK].tobytes() for b in range(2))
    vals = np.concatenate([float(scales[b]) * e4m3_decode(codes[b * BLOCK:(b + 1) * BLOCK]) for b in range(2)])
    out = {"values": values, "cols": 256, "hex": row.hex(), "row": [float(v) for v in vals]}
    VECTORS.write_text(json.dumps(out) + "\n")


def quantize_blocks(w, scale_bf16):
    """w [out, in] float64 -> (codes uint8 [out, in], scale float32 [ro, ci] or bf16 bits, dequantized)."""
    out, cols = w.shape
    ro, ci = -(-out // BLOCK), -(-cols // BLOCK)
    scale = np.zeros((ro, ci), dtype=np.float32)
    for i in range(ro):
        for j in range(ci):
            tile = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            scale[i, j] = np.abs(tile).max() / 448.0
    if scale_bf16:
        bits = bf16_round(scale)
        s64 = bf16_value(bits).reshape(ro, ci)
        stored = ("BF16", bits.tobytes())
    else:
        s64 = scale.astype(np.float64)
        stored = ("F32", scale.astype("<f4").tobytes())
    full = np.repeat(np.repeat(s64, BLOCK, 0), BLOCK, 1)[:out, :cols]
    codes = e4m3_encode(w / full)
    deq = e4m3_decode(codes) * full
    assert not np.isnan(deq).any()
    return codes, (stored, [ro, ci]), deq


def save_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


CONFIG = {
    "architectures": ["OlmoeForCausalLM"],
    "attention_bias": False,
    "clip_qkv": None,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 256,
    "model_type": "olmoe",
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 3,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 1,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "vocab_size": 256,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}


def write_fixture():
    rng = np.random.default_rng(20261201)
    c = CONFIG
    H, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = H // nh
    tensors, W = {}, {}

    def bf16(name, x):
        bits = bf16_round(x)
        tensors[name] = ("BF16", x.shape, bits.tobytes())
        W[name] = bf16_value(bits).reshape(x.shape)

    def fp8(name, out, cols, scale_bf16, gain=1.0):
        w = rng.normal(0.0, gain / np.sqrt(cols), size=(out, cols))
        codes, ((sdt, sbytes), sshape), deq = quantize_blocks(w, scale_bf16)
        tensors[name] = ("F8_E4M3", (out, cols), codes.tobytes())
        tensors[name + "_scale_inv"] = (sdt, sshape, sbytes)
        W[name] = deq

    def norm(n):
        return rng.uniform(0.7, 1.3, size=n)

    bf16("model.embed_tokens.weight", rng.normal(0.0, 1.0, size=(V, H)))
    for i in range(c["num_hidden_layers"]):
        p, sb = f"model.layers.{i}.", i == 1
        bf16(p + "input_layernorm.weight", norm(H))
        bf16(p + "post_attention_layernorm.weight", norm(H))
        bf16(p + "self_attn.q_norm.weight", norm(nh * hd))
        bf16(p + "self_attn.k_norm.weight", norm(nkv * hd))
        fp8(p + "self_attn.q_proj.weight", nh * hd, H, sb)
        fp8(p + "self_attn.k_proj.weight", nkv * hd, H, sb)
        fp8(p + "self_attn.v_proj.weight", nkv * hd, H, sb)
        fp8(p + "self_attn.o_proj.weight", H, nh * hd, sb)
        bf16(p + "mlp.gate.weight", rng.normal(0.0, 2.0 / np.sqrt(H), size=(c["num_experts"], H)))
        for e in range(c["num_experts"]):
            m = f"{p}mlp.experts.{e}."
            fp8(m + "gate_proj.weight", F, H, sb)
            fp8(m + "up_proj.weight", F, H, sb)
            fp8(m + "down_proj.weight", H, F, sb)
    bf16("model.norm.weight", norm(H))
    bf16("lm_head.weight", rng.normal(0.0, 2.0 / np.sqrt(H), size=(V, H)))

    FIXTURE.mkdir(parents=True, exist_ok=True)
    save_safetensors(FIXTURE / "model.safetensors", tensors)
    (FIXTURE / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    prompt = [int(t) for t in rng.integers(2, V, size=12)]
    prompt[7], prompt[10] = prompt[2], prompt[4]  # two repeated tokens
    logits = forward(W, c, prompt, "olmoe")
    top2 = np.sort(logits, axis=-1)[:, -2:]
    oracle = {
        "what": "numpy float64 forward (tools/check_fixtures.py) over the dequantized weights",
        "prompt": prompt,
        "logits": [[float(v) for v in row] for row in logits],
        "max_abs_logit": float(np.abs(logits).max()),
        "min_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
        "weight_tensors_fp8": sum(1 for t in tensors.values() if t[0] == "F8_E4M3"),
    }
    (FIXTURE / "oracle.json").write_text(json.dumps(oracle) + "\n")
    size = (FIXTURE / "model.safetensors").stat().st_size
    print(f"fp8_olmoe: {size} bytes, max |logit| {oracle['max_abs_logit']:.3f}, top-2 gap {oracle['min_top2_gap']:.3g}")


if __name__ == "__main__":
    check_codec()
    write_vectors()
    write_fixture()
    print(f"wrote {VECTORS.relative_to(ROOT)} and {FIXTURE.relative_to(ROOT)}/")
