"""The tiny fixtures of DeepSeek Sparse Attention (DeepSeek-V3.2 and GLM-MoE-DSA), for
make_fixtures.py: their configurations, the hooks that make their random weights well
conditioned, the check that every top-k cut of the indexer has a clear score gap (so that a
correct engine cannot legitimately select other positions because of float summation order),
and the tensor names save_pretrained must write. Imported by make_fixtures.py; not a script of
its own.
"""

import math

import torch

from fixtures_mixers import deepseek_post_init, deepseek_router_gap

# The k-th minus the (k+1)-th indexer score at every row that drops positions.
MIN_INDEX_GAP = 2e-4

DSA = {
    # DeepSeek-V3.2: DeepSeek-V3's MLA and MoE plus a lightning indexer per layer (8 heads of
    # 16, half-split RoPE on its first 8 columns), top-5 of a 14-token prompt.
    "deepseek_v32": dict(
        cls="DeepseekV32ForCausalLM",
        seed=11000,
        config=dict(
            vocab_size=288,
            hidden_size=64,
            intermediate_size=80,
            moe_intermediate_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=40,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=12,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=5,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 0.707},
            attention_bias=False,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "DeepSeek-V3.2, 3 layers (first dense, FFN 80), hidden 64, MLA with 4 heads, q_lora_rank 40, "
            "kv_lora_rank 32, qk_nope 16, qk_rope 8 (interleaved pairs), v_head_dim 12, YaRN factor 4; "
            "indexer 8 heads x 16 (half-split RoPE on the first 8), index_topk 5 < the 14-token prompt; "
            "8 routed experts (FFN 24) in 4 groups, top-2 groups, top-2, 1 shared expert"
        ),
    ),
    # GLM-MoE-DSA: the same with interleaved RoPE in the indexer and layers that reuse the
    # previous full layer's selection (`indexer_types`); one group; rms_norm_eps 1e-5.
    "glm_moe_dsa": dict(
        cls="GlmMoeDsaForCausalLM",
        seed=12000,
        config=dict(
            vocab_size=304,
            hidden_size=56,
            intermediate_size=72,
            moe_intermediate_size=20,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=2,
            q_lora_rank=36,
            kv_lora_rank=24,
            qk_nope_head_dim=12,
            qk_rope_head_dim=8,
            v_head_dim=10,
            n_routed_experts=6,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            indexer_types=["full", "shared", "full", "shared"],
            index_n_heads=6,
            index_head_dim=24,
            index_topk=6,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
            attention_bias=False,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "GLM-MoE-DSA, 4 layers (first dense, FFN 72), hidden 56, MLA with 2 heads, q_lora_rank 36, "
            "kv_lora_rank 24, qk_nope 12, qk_rope 8, v_head_dim 10, rope_theta 5e4; indexer 6 heads x 24 "
            "(interleaved RoPE on the first 8), index_topk 6 < the 14-token prompt, indexer_types "
            "full/shared/full/shared; 6 routed experts (FFN 20), top-2, x1.8, 1 shared expert, rms_norm_eps 1e-5"
        ),
    ),
}


@torch.no_grad()
def dsa_post_init(model):
    """A correction bias that changes choices (as DeepSeek-V3's); the indexer's query twice the
    generic scale, so that its scores spread and few ReLUs sit at zero together."""
    deepseek_post_init(model)
    for layer in model.model.layers:
        ix = getattr(layer.self_attn, "indexer", None)
        if ix is not None:
            ix.wq_b.weight.mul_(2.0)


@torch.no_grad()
def index_scores_of(model, ids):
    """The indexer scores `[S, S]` (causal, -inf above the diagonal) of every full layer over a
    no-cache forward of `ids`, recomputed from the indexer's inputs as transformers scores them."""
    mod = __import__(type(model).__module__, fromlist=["x"])
    interleave = hasattr(mod, "GlmMoeDsaIndexer")
    rot = mod.apply_rotary_pos_emb_interleave if interleave else mod.apply_rotary_pos_emb
    out, handles = [], []

    def hook(m, args, kwargs):
        names = ["hidden_states", "q_resid", "position_embeddings", "attention_mask"]
        got = dict(zip(names, args))
        got.update({k: v for k, v in kwargs.items() if k in names})
        x, qr, (cos, sin) = got["hidden_states"], got["q_resid"], got["position_embeddings"]
        b, s, _ = x.shape
        q = m.wq_b(qr).view(b, s, m.n_heads, m.head_dim)
        k = m.k_norm(m.wk(x)).unsqueeze(2)
        dr = m.qk_rope_head_dim
        qr_, kr_ = rot(q[..., :dr], k[..., :dr], cos, sin, unsqueeze_dim=2)
        q = torch.cat([qr_, q[..., dr:]], -1)
        k = torch.cat([kr_, k[..., dr:]], -1).squeeze(2)
        sc = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * m.softmax_scale)
        w = m.weights_proj(x).float() * (m.n_heads ** -0.5)
        idx = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        out.append(idx.masked_fill(~causal, float("-inf")))

    for layer in model.model.layers:
        ix = getattr(layer.self_attn, "indexer", None)
        if ix is not None:
            handles.append(ix.register_forward_pre_hook(hook, with_kwargs=True))
    model(input_ids=torch.tensor([ids]))
    for h in handles:
        h.remove()
    return out


def index_gap(model, ids):
    """The smallest k-th minus (k+1)-th indexer score over the rows that see more than
    `index_topk` positions, and how many positions the cut drops in all."""
    k = model.config.index_topk
    gap, dropped = math.inf, 0
    for scores in index_scores_of(model, ids):
        for s in range(k, scores.shape[0]):
            v = scores[s, : s + 1].topk(k + 1).values
            gap = min(gap, float(v[k - 1] - v[k]))
            dropped += s + 1 - k
    return gap, dropped


def dsa_accept(model, prompt, greedy):
    gap, dropped = index_gap(model, prompt + greedy[:-1])
    return gap >= MIN_INDEX_GAP, f"index gap {gap:.5f}, positions dropped {dropped}"


def dsa_probe(model, ids):
    gap, dropped = index_gap(model, ids)
    return {
        "index_note": "min over prompt + greedy[:-1] (no-cache forward) and over every full layer of the k-th minus the (k+1)-th indexer score, at rows that see more than index_topk positions",
        "min_index_score_gap": gap,
        "index_positions_dropped": dropped,
    }


for _spec in DSA.values():
    _spec["post_init"] = dsa_post_init
    _spec["router_gap"] = deepseek_router_gap
    _spec["accept"] = dsa_accept
    _spec["probe"] = dsa_probe
    _spec["attempts"] = 120


def dsa_names(name, cfg, n_layers):
    """The HF names save_pretrained must produce for these families."""
    out = []
    if name not in DSA:
        return out
    types = cfg.get("indexer_types") or ["full"] * n_layers
    for i in range(n_layers):
        if types[i] == "full":
            for w in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"):
                out.append(f"model.layers.{i}.self_attn.indexer.{w}")
        if i >= cfg["first_k_dense_replace"]:
            out.append(f"model.layers.{i}.mlp.gate.e_score_correction_bias")
            for e in range(cfg["n_routed_experts"]):
                for w in ("gate_proj", "up_proj", "down_proj"):
                    out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    return out
