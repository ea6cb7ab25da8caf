#!/usr/bin/env python3
"""Regenerate the reference fixtures under tests/fixtures/ from Hugging Face transformers.

The CPU path of coli is checked against an independent implementation of each
architecture: the eager (plain math) PyTorch code of transformers. This script
writes everything the Rust tests compare against.

Usage (from the repository root; needs torch, transformers 5.17, safetensors, gguf):

    ~/.venvs/oracle/bin/python tools/make_fixtures.py            # everything
    ~/.venvs/oracle/bin/python tools/make_fixtures.py tiny       # only the random-weight models
    ~/.venvs/oracle/bin/python tools/make_fixtures.py pymoe      # only tests/fixtures/pymoe_ref
    ~/.venvs/oracle/bin/python tools/make_fixtures.py smollm2    # only tests/fixtures/smollm2_ref
    ~/.venvs/oracle/bin/python tools/make_fixtures.py llama olmoe  # single tiny fixtures by name

Outputs:

* tests/fixtures/{llama,llama_tied,olmoe,qwen3_moe,mixtral,gpt_oss,deepseek_v3,qwen3_next,qwen3_5_moe,kimi_linear,inkling,deepseek_v32,glm_moe_dsa,deepseek_v4,...}/ :
  a tiny random-weight checkpoint (config.json, generation_config.json, model.safetensors, f32) written by
  ``save_pretrained`` and its ``oracle.json`` (prompt ids, logits of every prompt
  position, 20 greedy ids, the logits each greedy id was chosen from, per-layer
  residual stream and router choices for debugging). The oracle is computed from the
  checkpoint re-loaded from disk, so it describes exactly the committed files.
* tests/fixtures/pymoe_ref/oracle.json : the trained OLMoE checkpoint
  ../shared/models/pymoe-22m (not copied), run in float32.
* tests/fixtures/smollm2_ref/oracle.json : SmolLM2-135M-Instruct from its Q4_1 GGUF
  (~/.cache/coli/models/smollm2-135m-instruct/, or $COLI_SMOLLM2_DIR), dequantized to
  f32 by transformers.

Everything is deterministic (fixed seeds, one CPU thread). For the tiny models a seed
is accepted only if the fixture is well conditioned: logits of order 1-10, a greedy
continuation that is not one token repeated, a clear top-1/top-2 gap at every greedy
step, and a clear gap between the k-th and (k+1)-th router probability at every MoE
routing decision, so that a correct engine cannot legitimately pick another token or
another expert because of float summation order.
"""

import json
import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PYMOE_DIR = ROOT.parent / "shared" / "models" / "pymoe-22m"
SMOLLM2_DIR = Path(
    os.environ.get(
        "COLI_SMOLLM2_DIR",
        str(Path.home() / ".cache" / "coli" / "models" / "smollm2-135m-instruct"),
    )
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

N_GREEDY = 20
# Acceptance thresholds for a random-weight fixture.
MIN_GREEDY_MARGIN = 0.01  # top1 - top2 logit at each greedy step (f32 engines agree to ~1e-5)
MIN_ROUTER_GAP = 1e-3  # k-th minus (k+1)-th router logit at every routing decision
MIN_DISTINCT_GREEDY = 10  # of the 20 greedy ids
MAX_REPEAT_GREEDY = 4  # no id more often than this among the 20

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# --------------------------------------------------------------------------- helpers


def f32(values):
    """Floats as the shortest decimal that round-trips the float32 value."""
    a = np.asarray(values, dtype=np.float32)
    if a.ndim == 0:
        return float(str(a[()]))
    if a.ndim == 1:
        return [float(str(v)) for v in a]
    return [f32(row) for row in a]


def sig6(values):
    """Floats rounded to 6 significant digits (for the large real-model logits)."""
    a = np.asarray(values, dtype=np.float32)
    if a.ndim == 1:
        return [float("%.6g" % v) for v in a]
    return [sig6(row) for row in a]


def write_json(path, obj):
    """One top-level key per line, compact values: small diffs, readable headers."""
    lines = []
    for k, v in obj.items():
        lines.append("  %s: %s" % (json.dumps(k), json.dumps(v, separators=(",", ":"), ensure_ascii=False)))
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def topk_pairs(row, k):
    vals, idx = torch.topk(row, k)
    return [[int(i), f32(v)] for i, v in zip(idx.tolist(), vals.tolist())]


def decode(tok, ids):
    """Exact text of the ids: special tokens kept, no clean-up of spaces."""
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def margin(row):
    v = torch.topk(row, 2).values
    return float(v[0] - v[1])


def dir_bytes(d):
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


class Recorder:
    """Forward hooks on the decoder layers and MoE routers."""

    def __init__(self, model):
        self.layer_out = []
        self.router_logits = []
        self.handles = []
        layers = model.model.layers
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_hook(self._layer_hook(i)))
            gate = self._router_of(layer)
            if gate is not None:
                self.handles.append(gate.register_forward_hook(self._router_hook(i)))
        self.n_layers = len(layers)

    @staticmethod
    def _router_of(layer):
        for attr in ("mlp", "block_sparse_moe"):
            block = getattr(layer, attr, None)
            if block is not None and hasattr(block, "gate") and hasattr(block, "experts"):
                return block.gate
            if block is not None and hasattr(block, "router") and hasattr(block, "experts"):
                return block.router  # gpt-oss
        return None

    def _layer_hook(self, i):
        def hook(_mod, _inp, out):
            h = out[0] if isinstance(out, tuple) else out
            self.layer_out.append((i, h.detach()[0].clone()))

        return hook

    def _router_hook(self, i):
        def hook(_mod, _inp, out):
            logits = out[0] if isinstance(out, tuple) else out
            self.router_logits.append((i, logits.detach().float().clone()))

        return hook

    def clear(self):
        self.layer_out.clear()
        self.router_logits.clear()

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def run_prompt_and_greedy(model, prompt_ids, n_greedy, rec=None):
    """Full forward of the prompt (no cache), then greedy decoding with the KV cache."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    if rec is not None:
        rec.clear()
    out = model(input_ids=ids, use_cache=True)
    prompt_logits = out.logits[0].float()
    prompt_layers = list(rec.layer_out) if rec is not None else []
    prompt_router = list(rec.router_logits) if rec is not None else []
    past = out.past_key_values
    row = prompt_logits[-1]
    greedy, greedy_logits, decode_router = [], [], []
    for step in range(n_greedy):
        nxt = int(torch.argmax(row))
        greedy.append(nxt)
        greedy_logits.append(row.clone())
        if step == n_greedy - 1:
            break
        if rec is not None:
            rec.clear()
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].float()
        if rec is not None:
            decode_router.extend(rec.router_logits)
    return prompt_logits, greedy, greedy_logits, prompt_layers, prompt_router, decode_router


def router_min_gap(router_entries, top_k):
    gap = math.inf
    for _layer, logits in router_entries:
        v = torch.topk(logits, top_k + 1, dim=-1).values
        gap = min(gap, float((v[:, top_k - 1] - v[:, top_k]).min()))
    return gap


# --------------------------------------------------------------------------- tiny models


def rope(theta):
    return {"rope_type": "default", "rope_theta": float(theta)}


COMMON = dict(attn_implementation="eager", experts_implementation="eager", dtype="float32")

TINY = {
    # Dense Llama, untied head, GQA 4q/2kv, head_dim 16 = hidden/heads, rope 10000.
    "llama": dict(
        cls="LlamaForCausalLM",
        seed=1000,
        config=dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters=rope(10000.0),
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
        ),
        note="Llama, untied lm_head, GQA 4 query / 2 kv heads, head_dim 16, rope_theta 1e4, rms_norm_eps 1e-5",
    ),
    # Dense Llama, tied head, head_dim 32 != hidden/heads (96/4 = 24), rope 1e6, eps 1e-6.
    "llama_tied": dict(
        cls="LlamaForCausalLM",
        seed=2000,
        config=dict(
            vocab_size=256,
            hidden_size=96,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters=rope(1000000.0),
            tie_word_embeddings=True,
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
        ),
        note=(
            "Llama, tied embeddings (no lm_head.weight in the file), MQA 4 query / 1 kv head, "
            "head_dim 32 != hidden/heads 24, rope_theta 1e6, rms_norm_eps 1e-6"
        ),
    ),
    # Dense Llama with biases on every projection (`attention_bias`, `mlp_bias`), small.
    "llama_bias": dict(
        cls="LlamaForCausalLM",
        seed=2500,
        config=dict(
            vocab_size=200,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters=rope(10000.0),
            tie_word_embeddings=False,
            attention_bias=True,
            mlp_bias=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
        ),
        note="Llama with biases on q, k, v, o (attention_bias) and gate, up, down (mlp_bias), GQA 4/2, head_dim 12",
    ),
    # OLMoE: q_norm/k_norm over the whole projection (not per head), softmax router,
    # top-2 of 8, norm_topk_prob False (weights are the raw softmax probabilities).
    "olmoe": dict(
        cls="OlmoeForCausalLM",
        seed=3000,
        config=dict(
            vocab_size=384,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters=rope(10000.0),
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            clip_qkv=None,
            tie_word_embeddings=False,
            attention_bias=False,
            output_router_logits=False,
            bos_token_id=None,
            eos_token_id=0,
            pad_token_id=1,
        ),
        note=(
            "OLMoE, 8 experts top-2, norm_topk_prob=False, expert FFN 32, GQA 4/2, head_dim 16, "
            "q_norm over 64 = heads*head_dim and k_norm over 32 = kv_heads*head_dim (whole projection, "
            "before the per-head reshape and RoPE), rope_theta 1e4"
        ),
    ),
    # Qwen3-MoE: per-head q_norm/k_norm, head_dim 32 != hidden/heads (16), top-2 of 8
    # with norm_topk_prob True, rope 1e6.
    "qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM",
        seed=4000,
        config=dict(
            vocab_size=448,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters=rope(1000000.0),
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            tie_word_embeddings=False,
            attention_bias=False,
            output_router_logits=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "Qwen3-MoE, 8 experts top-2, norm_topk_prob=True, expert FFN 48, GQA 4/2, head_dim 32 "
            "!= hidden/heads 16 (q_proj 64->128, o_proj 128->64), per-head q_norm/k_norm over head_dim, "
            "rope_theta 1e6, rms_norm_eps 1e-6, every layer sparse"
        ),
    ),
    # Mixtral: no q/k norm, softmax router then renormalised top-2 of 6.
    "mixtral": dict(
        cls="MixtralForCausalLM",
        seed=5000,
        config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=56,  # != hidden, so w1/w3 [56, 64] and w2 [64, 56] cannot be confused
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters=rope(1000000.0),
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=None,
            router_jitter_noise=0.0,
            tie_word_embeddings=False,
            output_router_logits=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
        ),
        note=(
            "Mixtral, 6 experts top-2 (softmax over all experts, top-2, renormalised), expert FFN 56, "
            "GQA 4/2, head_dim 16, rope_theta 1e6, no sliding window"
        ),
    ),
}


from fixtures_mixers import MIXERS, mixer_names  # noqa: E402 (beside this script)

TINY.update(MIXERS)

from fixtures_dsa import DSA, dsa_names  # noqa: E402 (beside this script)

TINY.update(DSA)

from fixtures_v4 import V4  # noqa: E402 (beside this script)

TINY.update(V4)


# Per-tensor gains for the re-initialisation: std = gain / sqrt(fan_in), fan_in = last dim.
GAINS = [
    ("q_proj", 1.5),
    ("k_proj", 1.5),
    ("lm_head", 2.0),
    ("gate.weight", 2.0),  # the MoE routers (mlp.gate / block_sparse_moe.gate)
]


@torch.no_grad()
def reinit(model, tied):
    """Scale weights so activations stay O(1) and logits are O(1-10); norms random around 1."""
    for name, p in model.named_parameters():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            # gpt-oss: input-major [E, in, out]; gate_up large enough that the clamp acts.
            p.normal_(0.0, (3.0 if "gate_up" in name else 1.0) / math.sqrt(p.shape[-2]))
            continue
        if name.endswith("_proj_bias") or name.endswith(".bias"):
            p.normal_(0.0, 0.1)
            continue
        if name.endswith("self_attn.sinks"):
            p.normal_(0.0, 1.0)
            continue
        if name.endswith("linear_attn.A_log"):
            # Qwen3-Next: decay rates exp(A_log) in [0.05, 1], so the state remembers a while.
            p.copy_(torch.empty_like(p).uniform_(0.05, 1.0).log())
            continue
        if name.endswith("linear_attn.dt_bias") or name.endswith("forget_gate.dt_bias"):
            p.normal_(0.0, 0.5)
            continue
        if ".attn_hc." in name or ".ffn_hc." in name or ".hc_head." in name:
            continue  # DeepSeek V4's hyper-connections: set by its post_init (fixtures_v4.py)
        if name.endswith("global_scale"):
            # Inkling's scalar scales of the dense MLP and the router.
            p.uniform_(0.7, 1.3)
            continue
        if p.ndim == 1:
            assert "norm" in name, name
            p.uniform_(0.7, 1.3)
        elif "embed_tokens" in name:
            # Tied: keep the token's own embedding from dominating its logit (else greedy repeats).
            p.normal_(0.0, 0.15 if tied else 1.0)
        else:
            gain = 1.0
            for key, g in GAINS:
                if key in name:
                    gain = g
            p.normal_(0.0, gain / math.sqrt(p.shape[-1]))


def prompt_for(seed, vocab, n=14):
    r = random.Random(seed)
    ids = [r.randrange(3, vocab) for _ in range(n)]
    # Repeat a few tokens so that attention sees identical keys at different positions.
    ids[9] = ids[2]
    ids[12] = ids[5]
    return ids


def expected_names(name, cfg, n_layers):
    """The per-expert HF names that save_pretrained must produce."""
    out = []
    if name in ("olmoe", "qwen3_moe"):
        for i in range(n_layers):
            out.append(f"model.layers.{i}.mlp.gate.weight")
            for e in range(cfg["num_experts"]):
                for w in ("gate_proj", "up_proj", "down_proj"):
                    out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    out.extend(mixer_names(name, cfg, n_layers))
    out.extend(dsa_names(name, cfg, n_layers))
    if name == "mixtral":
        for i in range(n_layers):
            out.append(f"model.layers.{i}.block_sparse_moe.gate.weight")
            for e in range(cfg["num_local_experts"]):
                for w in ("w1", "w2", "w3"):
                    out.append(f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight")
    return out


def make_tiny(name, spec=None, out_dir=None):
    """Writes the fixture `name` (its entry of TINY, or `spec` of the same shape) into
    tests/fixtures/<name>/ (or `out_dir`)."""
    import transformers
    from safetensors import safe_open

    spec = spec or TINY[name]
    cls = getattr(transformers, spec["cls"])
    cfg_cls = cls.config_class
    cfg_kwargs = dict(spec["config"])
    top_k = cfg_kwargs.get("num_experts_per_tok")
    out_dir = Path(out_dir) if out_dir else FIXTURES / name
    tied = cfg_kwargs["tie_word_embeddings"]

    for attempt in range(spec.get("attempts", 40)):
        seed = spec["seed"] + attempt
        torch.manual_seed(seed)
        config = cfg_cls(**cfg_kwargs)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager" if top_k else None
        model = cls(config).float().eval()
        reinit(model, tied)
        if "post_init" in spec:
            spec["post_init"](model)
        if tied:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

        out_dir.mkdir(parents=True, exist_ok=True)
        for f in out_dir.iterdir():
            f.unlink()
        model.save_pretrained(out_dir)

        # The oracle comes from the checkpoint as saved.
        model = cls.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager",
                                    **({"experts_implementation": "eager"} if top_k else {})).eval()
        rec = Recorder(model)
        prompt = prompt_for(seed, cfg_kwargs["vocab_size"], spec.get("prompt_len", 14))
        logits, greedy, g_logits, layers, p_router, d_router = run_prompt_and_greedy(model, prompt, N_GREEDY, rec)
        rec.remove()

        max_abs = float(logits.abs().max())
        g_margin = min(margin(r) for r in g_logits)
        gap_fn = spec.get("router_gap", lambda _m, entries, k: router_min_gap(entries, k))
        r_gap = gap_fn(model, p_router + d_router, top_k) if top_k else math.inf
        distinct = len(set(greedy))
        repeat = max(greedy.count(t) for t in greedy)
        ok = (1.0 <= max_abs <= 20.0 and g_margin >= MIN_GREEDY_MARGIN and r_gap >= MIN_ROUTER_GAP
              and distinct >= MIN_DISTINCT_GREEDY and repeat <= MAX_REPEAT_GREEDY)
        more = ""
        if ok and "accept" in spec:
            # A family's own condition (the indexer's top-k cut of DeepSeek Sparse Attention).
            extra_ok, more = spec["accept"](model, prompt, greedy)
            ok, more = ok and extra_ok, f", {more}"
        print(f"[{name}] seed {seed}: max|logit| {max_abs:.3f}, greedy margin {g_margin:.4f}, "
              f"router gap {r_gap:.5f}, distinct greedy {distinct}, max repeat {repeat}{more} -> {'ok' if ok else 'retry'}")
        if ok:
            break
    else:
        raise SystemExit(f"[{name}] no acceptable seed")

    # Full-recompute check: the cached decode agrees with a no-cache forward of the whole sequence.
    with torch.no_grad():
        full = model(input_ids=torch.tensor([prompt + greedy[:-1]])).logits[0].float()
    cache_dev = float((full[len(prompt) - 1:] - torch.stack(g_logits)).abs().max())
    assert cache_dev < 1e-4 * max_abs, cache_dev

    # Tensor names in the saved file.
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        names = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    # Integer tensors where the family has them (DeepSeek V4's hash table of expert ids).
    assert "F32" in dtypes and dtypes <= {"F32", *spec.get("int_dtypes", ())}, dtypes
    expected = expected_names(name, cfg_kwargs, cfg_kwargs["num_hidden_layers"]) if spec.get("check_names", True) else []
    missing = [n for n in expected if n not in names]
    fused = [n for n in names if "gate_up_proj" in n or (".experts." in n and not n.split(".experts.")[1][0].isdigit())]
    if spec.get("fused"):
        fused = []  # this family is stored fused on disk (gpt-oss)
    assert not missing and not fused, (missing[:5], fused[:5])
    # The head's name on disk (DeepSeek V4 saves the original checkpoints' `head.weight`).
    assert (spec.get("head", "lm_head.weight") in names) == (not tied), "lm_head presence vs tie_word_embeddings"

    # Debug records: residual stream after each layer, router top-k per layer and position.
    layer_out = [None] * rec.n_layers
    for i, h in layers:
        layer_out[i] = f32(h)
    router = None
    if top_k:
        router = {"top_k": top_k, "layers": []}
        for i, lg in p_router:
            probs = torch.softmax(lg, dim=-1)
            v, idx = torch.topk(probs, top_k, dim=-1)
            router["layers"].append({"layer": i, "ids": idx.tolist(), "probs": f32(v)})

    extra = spec["probe"](model, prompt + greedy[:-1]) if "probe" in spec else {}

    oracle = {
        "model": spec["cls"],
        "config_note": spec["note"],
        "seed": seed,
        "torch_dtype": "float32",
        "attn_implementation": "eager",
        "prompt_ids": prompt,
        "greedy": greedy,
        "max_abs_logit": f32(max_abs),
        "min_greedy_margin": f32(g_margin),
        "min_router_logit_gap": f32(r_gap) if top_k else None,
        "tolerance_note": "f32 math: compare logits with atol 1e-4 * max_abs_logit; greedy ids must be identical",
        "logits_shape": list(logits.shape),
        "logits": f32(logits),
        "greedy_logits_note": "greedy_logits[i] is the logits row greedy[i] was chosen from (argmax); greedy_logits[0] == logits[-1]; rows 1.. come from KV-cached decode steps",
        "greedy_logits": f32(torch.stack(g_logits)),
        "hidden_after_layer_note": "hidden_after_layer[l][t] is the residual stream after decoder layer l at prompt position t (before the final norm)",
        "hidden_after_layer": layer_out,
        "router_note": "router.layers[l].ids[t] are the top_k expert ids (descending probability) at prompt position t; probs are the softmax probabilities over all experts before any renormalisation" if top_k else None,
        "router": router,
        "tensor_names": sorted(names),
        **extra,
    }
    oracle = {k: v for k, v in oracle.items() if v is not None}
    write_json(out_dir / "oracle.json", oracle)
    print(f"[{name}] wrote {out_dir} ({dir_bytes(out_dir)} bytes), greedy {greedy}")


# --------------------------------------------------------------------------- pymoe-22m

PYMOE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef read_config(path):\n",
    # The blank line is deliberate: without it a decode step has two router logits within
    # 2.4e-5 of each other at the top-4 boundary, too close for an f32 engine to be judged on.
    "class Stack:\n\n    def __init__(self):",
]


def make_pymoe():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PYMOE_DIR)
    model = AutoModelForCausalLM.from_pretrained(
        PYMOE_DIR, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    cfg = model.config
    prompts = []
    max_abs = 0.0
    for text in PYMOE_PROMPTS:
        ids = tok(text)["input_ids"]
        rec = Recorder(model)
        logits, greedy, g_logits, _, p_router, d_router = run_prompt_and_greedy(model, ids, 16, rec)
        rec.remove()
        gap = router_min_gap(p_router + d_router, cfg.num_experts_per_tok)
        max_abs = max(max_abs, float(logits.abs().max()))
        prompts.append({
            "text": text,
            "prompt_ids": ids,
            "logits": sig6(logits),
            "greedy": greedy,
            "greedy_text": decode(tok, greedy),
            "greedy_margins": [round(margin(r), 5) for r in g_logits],
            "min_router_logit_gap": f32(gap),
            "max_abs_logit": f32(float(logits.abs().max())),
        })
        print(f"[pymoe] {text!r}: {len(ids)} ids, greedy {decode(tok, greedy)!r}, "
              f"min greedy margin {min(prompts[-1]['greedy_margins'])}, min router gap {gap:.2e}")
    out_dir = FIXTURES / "pymoe_ref"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "oracle.json", {
        "model": "OlmoeForCausalLM",
        "checkpoint": "../shared/models/pymoe-22m (relative to the repository root; bf16 safetensors)",
        "dtype": "float32 (bf16 weights upcast exactly; all activations float32, eager attention)",
        "config_note": (
            f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads, "
            f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}, norm_topk_prob={cfg.norm_topk_prob}, "
            f"vocab {cfg.vocab_size}, untied"
        ),
        "tokenizer_note": "ids from AutoTokenizer(tokenizer.json in the checkpoint) with default add_special_tokens; greedy is 16 argmax steps with the KV cache, not stopped at EOS",
        "logits_note": "logits[t] over the full vocabulary for every prompt position, rounded to 6 significant digits",
        "tolerance_note": "compare logits with atol 1e-4 * max_abs_logit (plus the 6-digit rounding); greedy ids identical",
        "margins_note": "greedy_margins[i]: top1 - top2 logit of the row greedy[i] was chosen from; min_router_logit_gap: smallest k-th minus (k+1)-th router logit over all layers, prompt positions and decode steps (a near tie there could let a correct f32 engine pick another expert)",
        "max_abs_logit": f32(max_abs),
        "prompts": prompts,
    })
    print(f"[pymoe] wrote {out_dir} ({dir_bytes(out_dir)} bytes)")


# --------------------------------------------------------------------------- SmolLM2 GGUF

SMOLLM2_PLAIN = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]
SMOLLM2_CHAT = "What is the capital of France? Answer in one sentence."
SMOLLM2_GREEDY = 20


@torch.no_grad()
def check_gguf_qk_permutation(model):
    """Compare the GGUF's raw attn_q/attn_k rows with the q_proj/k_proj transformers uses."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(SMOLLM2_DIR / SMOLLM2_GGUF))
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    res = {}
    for gname, hf, n_heads in (("blk.0.attn_q.weight", model.model.layers[0].self_attn.q_proj.weight, cfg.num_attention_heads),
                               ("blk.0.attn_k.weight", model.model.layers[0].self_attn.k_proj.weight, cfg.num_key_value_heads)):
        t = tensors[gname]
        raw = dequantize(t.data, t.tensor_type).reshape(hf.shape)
        hf = hf.numpy()
        # un-permute: within each head, GGUF row 2i <-> HF row i, GGUF row 2i+1 <-> HF row i + hd/2
        unperm = raw.reshape(n_heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(hf.shape)
        res[gname] = {
            "raw_equals_hf": bool(np.array_equal(raw, hf)),
            "unpermuted_equals_hf": bool(np.array_equal(unperm, hf)),
            "quant_type": t.tensor_type.name,
        }
    return res


def make_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        SMOLLM2_DIR, gguf_file=SMOLLM2_GGUF, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    perm = check_gguf_qk_permutation(model)
    from gguf import GGUFReader

    meta = GGUFReader(str(SMOLLM2_DIR / SMOLLM2_GGUF)).fields
    gguf_bos = int(meta["tokenizer.ggml.bos_token_id"].parts[-1][0])
    gguf_eos = int(meta["tokenizer.ggml.eos_token_id"].parts[-1][0])
    print("[smollm2] q/k permutation:", perm)

    messages = [{"role": "user", "content": SMOLLM2_CHAT}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(rendered, add_special_tokens=False)["input_ids"]
    via_template = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(via_template, dict) or hasattr(via_template, "keys"):
        via_template = via_template["input_ids"]
    assert list(via_template) == chat_ids, (via_template, chat_ids)

    cases = [(SMOLLM2_PLAIN[0], False, None, tok(SMOLLM2_PLAIN[0])["input_ids"]),
             (SMOLLM2_CHAT, True, rendered, chat_ids),
             (SMOLLM2_PLAIN[1], False, None, tok(SMOLLM2_PLAIN[1])["input_ids"])]
    prompts = []
    max_abs = 0.0
    for text, chat, rendered_text, ids in cases:
        logits, greedy, g_logits, _, _, _ = run_prompt_and_greedy(model, ids, SMOLLM2_GREEDY)
        m = float(logits.abs().max())
        max_abs = max(max_abs, m)
        entry = {
            "text": text,
            "chat_template_applied": chat,
        }
        if chat:
            entry["messages"] = messages
            entry["add_generation_prompt"] = True
            entry["rendered"] = rendered_text
        entry.update({
            "prompt_ids": ids,
            "prompt_tokens": tok.convert_ids_to_tokens(ids),
            "last_logits": f32(logits[-1]),
            "top20": [topk_pairs(row, 20) for row in logits],
            "greedy": greedy,
            "greedy_text": decode(tok, greedy),
            "greedy_text_until_eos": decode(tok, greedy[: greedy.index(gguf_eos) + 1] if gguf_eos in greedy else greedy),
            "greedy_top5": [topk_pairs(row, 5) for row in g_logits],
            "greedy_margins": [round(margin(r), 5) for r in g_logits],
            "max_abs_logit": f32(m),
        })
        prompts.append(entry)
        print(f"[smollm2] {text!r}: {len(ids)} ids, greedy {decode(tok, greedy)!r}, min margin {min(entry['greedy_margins'])}")

    cfg = model.config
    out_dir = FIXTURES / "smollm2_ref"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "oracle.json", {
        "model": "LlamaForCausalLM (SmolLM2-135M-Instruct)",
        "gguf": f"{SMOLLM2_GGUF} (98,362,432 bytes; ~/.cache/coli/models/smollm2-135m-instruct/)",
        "dtype": "float32: every GGUF tensor (Q4_1 matrices, Q8_0 token embedding, F32 norms) dequantized to f32 by transformers/gguf, then eager f32 math",
        "config_note": (
            f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, FFN {cfg.intermediate_size}, "
            f"{cfg.num_attention_heads} q / {cfg.num_key_value_heads} kv heads, rope_theta "
            f"{cfg.rope_parameters['rope_theta']}, rms_norm_eps {cfg.rms_norm_eps}, vocab {cfg.vocab_size}, "
            f"tie_word_embeddings {cfg.tie_word_embeddings}"
        ),
        "expected_agreement": (
            "The oracle uses exactly the values the quantized blocks encode (dequantized to f32), so an engine "
            "computing on the Q4_1/Q8_0 blocks differs only in the order of float operations (and in any "
            "re-quantization of activations, e.g. to Q8 for integer dot products, which this oracle does not do). "
            "Measured: tools/check_fixtures.py, a float64 NumPy forward on the GGUF's raw dequantized tensors "
            "(interleaved RoPE, no un-permutation), agrees with last_logits to < 5e-5 absolute (~1.3e-6 of "
            "max_abs_logit). An engine that dequantizes blocks and accumulates in f32 should therefore land within "
            "1e-4 * max_abs_logit, with the same top-20 ids except where neighbouring logits are closer than its "
            "error, and identical greedy ids (the smallest greedy margin is 0.08). An engine that re-quantizes "
            "activations (Q8 dot products) is looser: judge it by the top ids and the greedy ids."
        ),
        "rope_qk_permutation": {
            "finding": (
                "llama.cpp's converter permutes the rows of attn_q/attn_k within each head for interleaved RoPE "
                "(rotating adjacent pairs 2i, 2i+1). transformers' GGUF loader reverses it (LlamaTensorProcessor."
                "_reverse_permute_weights) so its rotate_half RoPE (pairs i, i+head_dim/2) applies. On the GGUF's "
                "raw weights an engine must therefore rotate adjacent pairs (2i, 2i+1), or un-permute q/k rows at "
                "load time and rotate half-split pairs."
            ),
            "check_layer0": perm,
            "unpermute": "hf_row[h*hd + j] = gguf_row[h*hd + 2*j] for j < hd/2, hf_row[h*hd + hd/2 + j] = gguf_row[h*hd + 2*j + 1]",
        },
        "tokenizer_note": "ids from AutoTokenizer(gguf_file=...), add_special_tokens default (no BOS is added); the chat prompt is the rendered template tokenized with add_special_tokens=False (same ids as apply_chat_template(tokenize=True))",
        "logits_note": "last_logits: full-vocabulary logits at the last prompt position; top20[t]: [id, logit] pairs at every prompt position, descending",
        "greedy_note": f"{SMOLLM2_GREEDY} argmax steps with the KV cache, not stopped at EOS (id 2, <|im_end|>); greedy_text_until_eos stops after the first EOS; texts are decoded with special tokens and without space clean-up; greedy_top5[i] is the top-5 of the row greedy[i] was chosen from; greedy_margins[i] its top1 - top2 gap",
        "bos_token_id": gguf_bos,
        "eos_token_id": gguf_eos,
        "special_tokens_note": (
            f"bos/eos are the GGUF's tokenizer.ggml.bos_token_id/eos_token_id ({gguf_bos} <|im_start|>, {gguf_eos} "
            f"<|im_end|>; add_bos_token false). transformers' GGUF tokenizer reports eos_token_id "
            f"{tok.eos_token_id} ({tok.eos_token}); that is its conversion's quirk, not the model's EOS."
        ),
        "max_abs_logit": f32(max_abs),
        "prompts": prompts,
    })
    print(f"[smollm2] wrote {out_dir} ({dir_bytes(out_dir)} bytes)")


def main(argv):
    import transformers

    transformers.utils.logging.disable_progress_bar()
    targets = argv or ["tiny", "pymoe", "smollm2"]
    for t in targets:
        if t == "tiny":
            for name in TINY:
                make_tiny(name)
        elif t in TINY:
            make_tiny(t)
        elif t == "pymoe":
            make_pymoe()
        elif t == "smollm2":
            make_smollm2()
        else:
            raise SystemExit(f"unknown target {t!r}: use tiny, pymoe, smollm2 or one of {list(TINY)}")


if __name__ == "__main__":
    main(sys.argv[1:])
