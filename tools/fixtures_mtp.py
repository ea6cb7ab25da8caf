"""Tiny DeepSeek-V3, DeepSeek-V3.2 and GLM-MoE-DSA (GLM-5) checkpoints with their multi-token
prediction (MTP) layer, and the MTP layer's logits computed with transformers' own modules:
tests/fixtures/{deepseek_v3,deepseek_v32,glm_moe_dsa}_mtp/.

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

Run with the oracle environment (torch, transformers 5.17, safetensors):
    ~/.venvs/oracle/bin/python tools/fixtures_mtp.py [deepseek_v3|deepseek_v32|glm_moe_dsa]...
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
}


def rms(cfg, x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))


def mtp_forward(cfg, small, layer, mtp, ids):
    """The MTP rows of `ids` ([batch, n]): row i reads the model's final hidden state at i and
    the token at i + 1; returns their logits [batch, n - 1, vocab]."""
    h = small.model(input_ids=ids).last_hidden_state  # after the final norm
    n = ids.shape[1] - 1
    e = rms(cfg, small.model.embed_tokens(ids[:, 1:]), mtp["enorm"])
    x = torch.cat([e, rms(cfg, h[:, :-1], mtp["hnorm"])], dim=-1) @ mtp["eh_proj"].T
    pos = torch.arange(n)[None].expand(ids.shape[0], -1)
    pe = small.model.rotary_emb(x, pos)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    y = y[0] if isinstance(y, tuple) else y
    return rms(cfg, y, mtp["shared_head.norm"]) @ mtp["shared_head.head"].T


def distill(cfg, small, layer, mtp, steps=300):
    """Trains the MTP layer a little on the model's own greedy continuations (the token two
    ahead), so that its guesses are often right: a test of speculation needs acceptances."""
    with torch.no_grad():
        seqs = torch.randint(0, cfg.vocab_size, (128, 6), generator=torch.Generator().manual_seed(9102))
        for _ in range(26):
            nxt = small(input_ids=seqs).logits[:, -1].argmax(-1, keepdim=True)
            seqs = torch.cat([seqs, nxt], dim=1)
    params = [p for p in layer.parameters()] + [mtp[k] for k in mtp]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=3e-3)
    for step in range(steps):
        with torch.enable_grad():
            logits = mtp_forward(cfg, small, layer, mtp, seqs)[:, :-1]
            target = seqs[:, 2:]
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
        layer.self_attn.o_proj.weight.mul_(0.15)
    for layer in big.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            # A router that prefers some experts, and a correction bias that moves choices.
            gate.weight.mul_(4.0)
            gate.e_score_correction_bias.normal_(0.0, 0.1)
    hidden = cfg.hidden_size
    mtp = {
        "enorm": 1.0 + 0.2 * torch.randn(hidden),
        "hnorm": 1.0 + 0.2 * torch.randn(hidden),
        "eh_proj": 0.1 * torch.randn(hidden, 2 * hidden),
        "shared_head.norm": 1.0 + 0.2 * torch.randn(hidden),
        "shared_head.head": 0.15 * torch.randn(cfg.vocab_size, hidden),
    }

    # The model proper: the first LAYERS layers of `big`.
    small_cfg = fam["config"](LAYERS)
    small_cfg._attn_implementation = "eager"
    small = cls(small_cfg).eval()
    missing, unexpected = small.load_state_dict(big.state_dict(), strict=False)
    assert not missing, missing
    assert all(k.startswith(f"model.layers.{LAYERS}.") for k in unexpected), unexpected

    layer = big.model.layers[LAYERS]
    distill(cfg, small, layer, mtp)

    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(fam["seed"] + 1))
    logits = small(input_ids=ids).logits[0]
    mtp_logits = mtp_forward(cfg, small, layer, mtp, ids)

    OUT = out_dir
    OUT.mkdir(parents=True, exist_ok=True)
    big.save_pretrained(OUT, safe_serialization=True)
    tensors = load_file(OUT / "model.safetensors")
    for k, v in mtp.items():
        tensors[f"model.layers.{LAYERS}.{k}.weight"] = v.contiguous()
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
