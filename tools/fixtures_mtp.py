"""Tiny DeepSeek-V3, DeepSeek-V3.2, GLM-MoE-DSA (GLM-5), MiMo-V2-Flash, Qwen3-Next and Qwen3.5-MoE
checkpoints with their multi-token prediction (MTP) layer, and the MTP layer's logits computed
with transformers' own modules: tests/fixtures/{deepseek_v3,deepseek_v32,glm_moe_dsa,mimo_v2_flash,qwen3_next,qwen3_5_moe}_mtp/.

transformers' DeepseekV3ForCausalLM skips the MTP layer (`model.layers.{num_hidden_layers}.*`)
when it loads, so the reference is written here from its parts: the model's decoder layer class
at index `num_hidden_layers` (save_pretrained writes it under DeepSeek's names, as it writes the
others), and the MTP module as DeepSeek-V3's report and the serving engines define it:

    h'_i = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]),  logits_i = head(norm(layer(h')_i))

where `h_i` is the model's final hidden state (after its final norm) at position `i`, the layer
attends causally over the MTP rows at positions 0..i with RoPE at `i`, and row `i` guesses the
token at `i + 2`. Its weights are trained for a few seconds on the model's own greedy
continuations (`distill`), so that its guesses are often right, as a real MTP layer's are. The
checkpoint leaves out the MTP layer's `embed_tokens` (GLM's checkpoints do;
the model's embedding is read instead) and keeps its `shared_head.head`.

Qwen3-Next's and Qwen3.5's MTP module (`mtp.*`, as its checkpoints and the serving engines have it) is the same
with other names and zero-centred norms (scale 1 + w): `fc` for `eh_proj`,
`pre_fc_norm_embedding` / `pre_fc_norm_hidden` for `enorm` / `hnorm`, `norm` for the head's
norm, the model's `lm_head`, and its layer (a full-attention layer) under `mtp.layers.0.`.
MiMo-V2-Flash's keeps DeepSeek's names with `final_layernorm` for the head's norm, under
`model.mtp.layers.0.` beside its layer (a sliding-window layer with a dense FFN, whose FFN norm is
`pre_mlp_layernorm`), and the model's `lm_head`.

Run with the oracle environment (torch, transformers 5.17, safetensors):
    ~/.venvs/oracle/bin/python tools/fixtures_mtp.py [deepseek_v3|deepseek_v32|glm_moe_dsa|mimo_v2_flash|qwen3_next|qwen3_5_moe]...
"""

import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
LAYERS = 2
PROMPT_LEN = 13


def deepseek_v3(layers):
    return transformers.DeepseekV3Config(
        vocab_size=224,
        hidden_size=48,
        intermediate_size=72,
        moe_intermediate_size=20,
        num_hidden_layers=layers,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=32,
        kv_lora_rank=24,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=10,
        n_routed_experts=6,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
        num_nextn_predict_layers=1,
        max_position_embeddings=128,
        rope_theta=5000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def glm_moe_dsa(layers):
    # GLM-5's layout: the MTP layer (index 2) sparse, with an indexer of its own; the model's
    # second layer reuses the first's selection.
    return transformers.GlmMoeDsaConfig(
        vocab_size=208,
        hidden_size=40,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=28,
        kv_lora_rank=20,
        qk_nope_head_dim=10,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=6,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.0,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        mlp_layer_types=["dense", "sparse", "sparse"][:layers],
        indexer_types=["full", "shared", "full"][:layers],
        index_n_heads=4,
        index_head_dim=16,
        index_topk=5,
        num_nextn_predict_layers=1,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def deepseek_v32(layers):
    # DeepSeek-V3.2: V3's layers with an indexer in each (the MTP layer's too).
    return transformers.DeepseekV32Config(
        vocab_size=240,
        hidden_size=44,
        intermediate_size=60,
        moe_intermediate_size=20,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=30,
        kv_lora_rank=22,
        qk_nope_head_dim=12,
        qk_rope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=6,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=3,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=4,
        num_nextn_predict_layers=1,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 8000.0},
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def qwen3_5_moe(layers):
    # Qwen3.5-MoE: a Gated DeltaNet layer, a gated-attention layer; the MTP layer (index 2) is a
    # full-attention layer with the same sparse FFN (routed experts and the gated shared expert).
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=232,
        hidden_size=56,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=32,
        num_hidden_layers=layers,
        layer_types=["linear_attention", "full_attention", "full_attention"][:layers],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=10,
        linear_conv_kernel_dim=4,
        num_experts=6,
        num_experts_per_tok=2,
        mtp_num_hidden_layers=1,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        tie_word_embeddings=False,
        attention_bias=False,
        output_router_logits=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


# The MTP module's tensors as DeepSeek's checkpoints name them (under `model.layers.{LAYERS}.`).
DEEPSEEK_MTP = dict(zero_centred=False, prefix=f"model.layers.{LAYERS}.", own_head=True,
                    names=dict(enorm="enorm", hnorm="hnorm", proj="eh_proj", norm="shared_head.norm"))
# Qwen3-Next's and Qwen3.5's: `mtp.*`, the layer under `mtp.layers.0.`, zero-centred norms, the
# model's head.
QWEN_MTP = dict(zero_centred=True, prefix="mtp.", own_head=False, layer_prefix="mtp.layers.0.",
                names=dict(enorm="pre_fc_norm_embedding", hnorm="pre_fc_norm_hidden", proj="fc", norm="norm"))
QWEN35_MTP = dict(QWEN_MTP, mrope=True)
# MiMo-V2-Flash's: `model.mtp.layers.N.*`, the layer's own tensors beside `enorm`, `hnorm`,
# `eh_proj` and `final_layernorm`, its FFN norm named `pre_mlp_layernorm`; a sliding-window layer
# (with sinks) and a dense FFN; the model's head.
MIMO_MTP = dict(zero_centred=False, prefix="model.mtp.layers.0.", own_head=False, layer_prefix="model.mtp.layers.0.",
                layer_rename=[("post_attention_layernorm", "pre_mlp_layernorm")], rope_layer_type="sliding_attention",
                names=dict(enorm="enorm", hnorm="hnorm", proj="eh_proj", norm="final_layernorm"))


def mimo_v2_flash(layers):
    # MiMo-V2-Flash: a full-attention dense layer, a sliding-window MoE layer; the MTP layer
    # (index 2) a sliding-window layer with sinks and a dense FFN.
    return transformers.MiMoV2FlashConfig(
        vocab_size=200,
        hidden_size=48,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        v_head_dim=12,
        sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"][:layers],
        mlp_layer_types=["dense", "sparse", "dense"][:layers],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        },
        attention_value_scale=0.707,
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def qwen3_next(layers):
    # Qwen3-Next: a Gated DeltaNet layer, a gated-attention layer with a dense FFN
    # (`mlp_only_layers`); the MTP layer a sparse full-attention layer (index 2 here; index 0 of
    # `mtp.layers` as the serving engines count it for `mlp_only_layers`: sparse either way).
    return transformers.Qwen3NextConfig(
        vocab_size=216,
        hidden_size=48,
        intermediate_size=72,
        moe_intermediate_size=20,
        shared_expert_intermediate_size=28,
        num_hidden_layers=layers,
        layer_types=["linear_attention", "full_attention", "full_attention"][:layers],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=20,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=12,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=5,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        num_nextn_predict_layers=1,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False,
        attention_bias=False,
        output_router_logits=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )

FAMILIES = {
    "deepseek_v3": dict(
        cls="DeepseekV3ForCausalLM",
        config=deepseek_v3,
        seed=9100,
        note="DeepSeek-V3, 2 layers (dense, MoE) and one MTP layer (MoE) at index 2; hidden 48, MLA 3 heads "
        "(q_lora 32, kv_lora 24, nope 8, rope 8, v 10), 6 experts in 2 groups, top-2, one shared expert; "
        "the MTP layer's embed_tokens left out (the model's is read)",
    ),
    "deepseek_v32": dict(
        cls="DeepseekV32ForCausalLM",
        config=deepseek_v32,
        seed=9300,
        note="DeepSeek-V3.2, 2 layers (dense, MoE) and one MTP layer (MoE) at index 2, an indexer in each "
        "(4 heads x 16, top-4); hidden 44, MLA 2 heads (q_lora 30, kv_lora 22, nope 12, rope 8, v 8), 6 experts "
        "in 3 groups, top-2 groups, top-2, one shared expert; the MTP layer's embed_tokens left out",
    ),
    "glm_moe_dsa": dict(
        cls="GlmMoeDsaForCausalLM",
        config=glm_moe_dsa,
        seed=9200,
        note="GLM-MoE-DSA, 2 layers (dense with a full indexer, MoE sharing its selection) and one MTP layer "
        "(MoE, its own indexer) at index 2; hidden 40, MLA 2 heads (q_lora 28, kv_lora 20, nope 10, rope 8, "
        "v 12), indexer 4 heads x 16 top-5, 6 experts top-2, one shared expert; the MTP layer's embed_tokens "
        "left out",
    ),
    "qwen3_5_moe": dict(
        cls="Qwen3_5MoeForCausalLM",
        config=qwen3_5_moe,
        seed=9400,
        mtp=QWEN35_MTP,
        # Gated DeltaNet's normed output adds as much to the residual as the token's embedding:
        # scaled further, the next token depends mostly on this one, as for DeepSeek's.
        mix_scale=0.02,
        distill=dict(sequences=1024, batch=128, steps=600),
        note="Qwen3.5-MoE, 2 layers (Gated DeltaNet 2 key heads x 8, 4 value heads x 10; gated attention 4 q / "
        "2 kv heads x 16, partial RoPE 8 of 16) and one MTP layer (gated attention) under mtp.layers.0; "
        "hidden 56, 6 experts (FFN 24) top-2 and a gated shared expert (FFN 32) in every layer; "
        "mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.norm; the model's embedding and head",
    ),
    "mimo_v2_flash": dict(
        cls="MiMoV2FlashForCausalLM",
        config=mimo_v2_flash,
        seed=9600,
        mtp=MIMO_MTP,
        distill=dict(sequences=1024, batch=128, steps=600),
        note="MiMo-V2-Flash, 2 layers (full attention, dense FFN 64; sliding window 5 with sinks, 6 experts (FFN "
        "16) top-2) and one MTP layer (sliding window with sinks, dense) under model.mtp.layers.0 (its FFN norm "
        "`pre_mlp_layernorm`); hidden 48, 4 q heads over 1 kv head (full) or 2 (sliding), head_dim 16, v_head_dim "
        "12, partial RoPE 8 of 16; enorm, hnorm, eh_proj, final_layernorm; the model's embedding and head",
    ),
    "qwen3_next": dict(
        cls="Qwen3NextForCausalLM",
        config=qwen3_next,
        seed=9500,
        mtp=QWEN_MTP,
        mix_scale=0.02,
        distill=dict(sequences=1024, batch=128, steps=600),
        note="Qwen3-Next, 2 layers (Gated DeltaNet 2 key heads x 12, 2 value heads x 8; gated attention 2 q / "
        "1 kv head x 20, partial RoPE 10 of 20, dense FFN 72) and one MTP layer (gated attention, sparse) under "
        "mtp.layers.0; hidden 48, 5 experts (FFN 20) top-2 and a gated shared expert (FFN 28); mtp.fc, "
        "mtp.pre_fc_norm_embedding / _hidden, mtp.norm; the model's embedding and head",
    ),
}


def rms(cfg, x, w, zero_centred=False):
    scale = 1.0 + w if zero_centred else w
    return scale * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))


def mtp_forward(cfg, small, layer, mtp, ids, layout=DEEPSEEK_MTP, h=None):
    """The MTP rows of `ids` ([batch, n]): row i reads the model's final hidden state at i
    (`h`, computed when not given) and the token at i + 1; returns their logits
    [batch, n - 1, vocab]."""
    zc = layout["zero_centred"]
    if h is None:
        h = small.model(input_ids=ids).last_hidden_state  # after the final norm
    n = ids.shape[1] - 1
    e = rms(cfg, small.model.embed_tokens(ids[:, 1:]), mtp["enorm"], zc)
    x = torch.cat([e, rms(cfg, h[:, :-1], mtp["hnorm"], zc)], dim=-1) @ mtp["proj"].T
    pos = torch.arange(n)[None].expand(ids.shape[0], -1)
    # Qwen3.5's rotary takes the multimodal sections' positions (all the text position).
    if layout.get("mrope"):
        pe = small.model.rotary_emb(x, pos[None].expand(3, -1, -1))
    elif layout.get("rope_layer_type"):
        pe = small.model.rotary_emb(x, pos, layout["rope_layer_type"])
    else:
        pe = small.model.rotary_emb(x, pos)
    mask = torch.full((n, n), float("-inf")).triu(1)
    if layout.get("rope_layer_type") == "sliding_attention":
        # The window: row i attends to j with i - j < sliding_window.
        mask = mask + torch.full((n, n), float("-inf")).tril(-cfg.sliding_window)
    mask = mask[None, None]
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    y = y[0] if isinstance(y, tuple) else y
    head = mtp["head"] if layout["own_head"] else small.lm_head.weight
    return rms(cfg, y, mtp["norm"], zc) @ head.T


def greedy(small, seqs, new):
    for _ in range(new):
        nxt = small(input_ids=seqs).logits[:, -1].argmax(-1, keepdim=True)
        seqs = torch.cat([seqs, nxt], dim=1)
    return seqs


def distill(cfg, small, layer, mtp, layout, steps=300, sequences=128, batch=None):
    """Trains the MTP layer a little on the model's own greedy continuations (the token two
    ahead), so that its guesses are often right: a test of speculation needs acceptances.
    `sequences` continuations, `batch` of them a step (all when None: a model whose continuations
    depend on more of the context needs more of them, or the layer learns them by heart)."""
    with torch.no_grad():
        seqs = torch.randint(0, cfg.vocab_size, (sequences, 6), generator=torch.Generator().manual_seed(9102))
        seqs = greedy(small, seqs, 26)
        h = small.model(input_ids=seqs).last_hidden_state
    params = [p for p in layer.parameters()] + [mtp[k] for k in mtp]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=3e-3)
    pick = torch.Generator().manual_seed(9103)
    for step in range(steps):
        with torch.enable_grad():
            rows = torch.randperm(sequences, generator=pick)[:batch] if batch else slice(None)
            logits = mtp_forward(cfg, small, layer, mtp, seqs[rows], layout, h[rows])[:, :-1]
            target = seqs[rows][:, 2:]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 100 == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == target).float().mean()
            print(f"distill step {step}: loss {loss.item():.3f}, right {acc.item():.2f}")
    for p in params:
        p.requires_grad_(False)


@torch.no_grad()
def make(name):
    fam = FAMILIES[name]
    layout = fam.get("mtp", DEEPSEEK_MTP)
    out_dir = FIXTURES / f"{name}_mtp"
    cls = getattr(transformers, fam["cls"])
    torch.manual_seed(fam["seed"])
    # The model with one layer more: its last layer is the MTP layer's decoder layer.
    cfg = fam["config"](LAYERS + 1)
    cfg._attn_implementation = "eager"
    big = cls(cfg).eval()
    for p in big.parameters():
        p.normal_(0.0, 0.08)
    for name, p in big.named_parameters():
        if "norm" in name:
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
    for layer in big.model.layers[:LAYERS]:
        # Attention that mixes in little of the context: the next token depends mostly on
        # this one, so a small MTP layer can learn the model's continuations.
        mixer = getattr(layer, "self_attn", None) or layer.linear_attn
        (getattr(mixer, "o_proj", None) or mixer.out_proj).weight.mul_(fam.get("mix_scale", 0.15))
    for layer in big.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            # A router that prefers some experts, and a correction bias that moves choices.
            gate.weight.mul_(4.0)
            if hasattr(gate, "e_score_correction_bias"):
                gate.e_score_correction_bias.normal_(0.0, 0.1)
    hidden = cfg.hidden_size
    # Zero-centred norms store w where the scale is 1 + w.
    one = 0.0 if layout["zero_centred"] else 1.0
    mtp = {
        "enorm": one + 0.2 * torch.randn(hidden),
        "hnorm": one + 0.2 * torch.randn(hidden),
        "proj": 0.1 * torch.randn(hidden, 2 * hidden),
        "norm": one + 0.2 * torch.randn(hidden),
    }
    if layout["own_head"]:
        mtp["head"] = 0.15 * torch.randn(cfg.vocab_size, hidden)

    # The model proper: the first LAYERS layers of `big`.
    small_cfg = fam["config"](LAYERS)
    small_cfg._attn_implementation = "eager"
    small = cls(small_cfg).eval()
    missing, unexpected = small.load_state_dict(big.state_dict(), strict=False)
    assert not missing, missing
    assert all(k.startswith(f"model.layers.{LAYERS}.") for k in unexpected), unexpected

    layer = big.model.layers[LAYERS]
    distill(cfg, small, layer, mtp, layout, **fam.get("distill", {}))

    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(fam["seed"] + 1))
    logits = small(input_ids=ids).logits[0]
    mtp_logits = mtp_forward(cfg, small, layer, mtp, ids, layout)
    # How often the layer guesses right past the prompt (the model's own greedy continuation of
    # it: what a speculation test sees).
    seq = greedy(small, ids, 30)
    guess = mtp_forward(cfg, small, layer, mtp, seq, layout)[0].argmax(-1)
    right = (guess[PROMPT_LEN - 1 : -1] == seq[0, PROMPT_LEN + 1 :]).float().mean()
    print(f"right past the prompt: {right.item():.2f}")

    OUT = out_dir
    OUT.mkdir(parents=True, exist_ok=True)
    big.save_pretrained(OUT, safe_serialization=True)
    tensors = load_file(OUT / "model.safetensors")
    names = dict(layout["names"], head="shared_head.head")
    for k, v in mtp.items():
        tensors[f"{layout['prefix']}{names[k]}.weight"] = v.contiguous()
    if "layer_prefix" in layout:
        # The MTP layer's own names: `model.layers.{LAYERS}.` read as the layout's prefix.
        old = f"model.layers.{LAYERS}."
        def renamed(k):
            for a, b in layout.get("layer_rename", []):
                k = k.replace(a, b)
            return layout["layer_prefix"] + k[len(old):]

        tensors = {(renamed(k) if k.startswith(old) else k): v for k, v in tensors.items()}
    save_file(tensors, OUT / "model.safetensors", metadata={"format": "pt"})
    c = json.loads((OUT / "config.json").read_text())
    c["num_hidden_layers"] = LAYERS
    # Per-layer lists as a checkpoint's configuration has them: one entry per layer of the model.
    for key, v in c.items():
        if isinstance(v, list) and len(v) == LAYERS + 1:
            c[key] = v[:LAYERS]
    (OUT / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    gen = OUT / "generation_config.json"
    if gen.exists():
        gen.unlink()
    oracle = {
        "note": fam["note"],
        "prompt": ids[0].tolist(),
        "logits": logits.tolist(),
        "mtp_logits": mtp_logits[0].tolist(),
    }
    (OUT / "mtp.json").write_text(json.dumps(oracle) + "\n")
    print(f"wrote {OUT}: max |mtp logit| {mtp_logits.abs().max():.3f}, max |logit| {logits.abs().max():.3f}")


if __name__ == "__main__":
    for name in sys.argv[1:] or FAMILIES:
        make(name)
