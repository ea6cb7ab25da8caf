#!/usr/bin/env python3
"""Writes runtime/tests/data/quant_vectors.json: reference rows for coli's GGUF block decoders.

For Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 it quantizes seeded random values with gguf-py; for the
k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), IQ4_NL, IQ4_XS, MXFP4 and the grid formats IQ2_XXS,
IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (which gguf-py only decodes) it makes
seeded random blocks with sane f16 scales. Each entry holds the stored bytes (hex) and gguf-py's
dequantization, which the Rust test compares against.

Run with a Python that has numpy and gguf installed:
    python tools/make_quant_vectors.py
or with a gguf-py checkout on the path (numpy installed):
    PYTHONPATH=path/to/gguf-py python tools/make_quant_vectors.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "runtime" / "tests" / "data" / "quant_vectors.json"
rng = np.random.default_rng(20240611)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8)


def random_q4k(n_blocks):
    blocks = rng.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)
    blocks[:, 0:2] = f16_bytes(rng.uniform(0.001, 0.05, n_blocks)).reshape(n_blocks, 2)
    blocks[:, 2:4] = f16_bytes(rng.uniform(0.001, 0.05, n_blocks)).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def random_q6k(n_blocks):
    blocks = rng.integers(0, 256, size=(n_blocks, 210), dtype=np.uint8)
    blocks[:, 208:210] = f16_bytes(rng.uniform(0.0005, 0.01, n_blocks)).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def random_blocks(n_blocks, size, f16_fields, lo=0.001, hi=0.05):
    """Random bytes, with every f16 field at the given byte offsets a sane positive scale."""
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at in f16_fields:
        blocks[:, at:at + 2] = f16_bytes(rng.uniform(lo, hi, n_blocks)).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def entry(name, qtype, raw, cols):
    data = raw.reshape(1, -1)
    values = dequantize(data, qtype).reshape(-1).astype(np.float32)
    assert values.size == cols, (name, values.size, cols)
    return {"format": name, "cols": cols, "hex": bytes(raw).hex(), "values": [float(v) for v in values]}


def main():
    out = []
    for name, qtype in (("Q4_0", T.Q4_0), ("Q4_1", T.Q4_1), ("Q8_0", T.Q8_0)):
        x = (rng.standard_normal((1, 128)) * 0.1).astype(np.float32)
        raw = quantize(x, qtype).reshape(-1)
        out.append(entry(name, qtype, raw, 128))
    out.append(entry("Q4_K", T.Q4_K, random_q4k(2), 512))
    out.append(entry("Q6_K", T.Q6_K, random_q6k(2), 512))
    for name, qtype in (("Q5_0", T.Q5_0), ("Q5_1", T.Q5_1)):
        x = (rng.standard_normal((1, 128)) * 0.1).astype(np.float32)
        out.append(entry(name, qtype, quantize(x, qtype).reshape(-1), 128))
    # Random bytes (not quantized values) cover every bit pattern of the value and scale fields.
    out.append(entry("Q5_0", T.Q5_0, random_blocks(4, 22, [0]), 128))
    out.append(entry("Q5_1", T.Q5_1, random_blocks(4, 24, [0, 2]), 128))
    out.append(entry("Q2_K", T.Q2_K, random_blocks(2, 84, [80, 82]), 512))
    out.append(entry("Q3_K", T.Q3_K, random_blocks(2, 110, [108]), 512))
    out.append(entry("Q5_K", T.Q5_K, random_blocks(2, 176, [0, 2]), 512))
    out.append(entry("IQ4_NL", T.IQ4_NL, random_blocks(4, 18, [0]), 128))
    out.append(entry("IQ4_XS", T.IQ4_XS, random_blocks(2, 136, [0]), 512))
    # MXFP4: random nibbles under E8M0 scales around 1 and the two subnormal exponents.
    mx = rng.integers(0, 256, size=(6, 17), dtype=np.uint8)
    mx[:, 0] = [118, 121, 125, 128, 0, 1]
    out.append(entry("MXFP4", T.MXFP4, mx.reshape(-1), 192))
    # The grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), which gguf-py only decodes:
    # random bytes are valid grid indices, sign bits and 4-bit scales under a sane f16 d.
    for name, qtype, size in (
        ("IQ2_XXS", T.IQ2_XXS, 66),
        ("IQ2_XS", T.IQ2_XS, 74),
        ("IQ2_S", T.IQ2_S, 82),
        ("IQ3_XXS", T.IQ3_XXS, 98),
        ("IQ3_S", T.IQ3_S, 110),
    ):
        out.append(entry(name, qtype, random_blocks(3, size, [0]), 768))
    # IQ1_S (its d in front) and IQ1_M (its d's four nibbles the top nibbles of the four u16
    # scale words at 48, the words' other bits random 3-bit scales): every bit pattern of the
    # grid indices, delta signs and scales.
    out.append(entry("IQ1_S", T.IQ1_S, random_blocks(3, 50, [0]), 768))
    m = random_blocks(3, 56, []).reshape(3, 56)
    d = f16_bytes(rng.uniform(0.001, 0.05, 3)).view(np.uint16)
    words = m[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
    for k in range(4):
        words[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12)
    m[:, 48:56] = words.view(np.uint8)
    out.append(entry("IQ1_M", T.IQ1_M, m.reshape(-1), 768))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"generator": "tools/make_quant_vectors.py (gguf-py)", "rows": out}, indent=0) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
