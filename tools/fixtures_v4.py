"""The tiny fixture of DeepSeek V4 (sliding-window layers only), for make_fixtures.py: its
configuration, the hook that makes its random weights well conditioned (the hyper-connections'
mixing weights, a random hash table, a correction bias, experts large enough that the clamp of
the SwiGLU acts) and the margin of its routing decisions (the top-k layers' sqrt-softplus
scores plus the bias; a hash layer decides nothing). transformers saves V4 under the original
checkpoints' names (`attn.wq_a`, `ffn.experts.{e}.w1`, `hc_attn_fn`, `head.weight`, ...), the
experts one tensor each. Imported by make_fixtures.py; not a script of its own.
"""

import math

import torch

V4 = {
    # DeepSeek V4 with every layer `sliding_attention` (the compressor is not served yet):
    # 4 residual streams, heads of 32 with RoPE on their last 8 columns, one K=V head, a
    # window of 4 < the 14-token prompt, grouped output projection in 2 groups, 8 experts top-2
    # with sqrt-softplus scores, the first two layers routed by a hash table.
    "deepseek_v4": dict(
        cls="DeepseekV4ForCausalLM",
        seed=14000,
        int_dtypes=("I64",),
        head="head.weight",
        config=dict(
            vocab_size=256,
            hidden_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            q_lora_rank=32,
            partial_rotary_factor=0.25,
            rope_theta=10000.0,
            num_experts_per_tok=2,
            n_routed_experts=8,
            n_shared_experts=1,
            scoring_func="sqrtsoftplus",
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
            layer_types=["sliding_attention"] * 4,
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            hc_mult=4,
            hc_sinkhorn_iters=20,
            hc_eps=1e-6,
            swiglu_limit=2.0,
            sliding_window=4,
            o_groups=2,
            o_lora_rank=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "DeepSeek V4, 4 sliding_attention layers (window 4), hidden 64, 4 hyper-connection streams "
            "(20 Sinkhorn iterations), q_lora_rank 32, 4 heads x 32 with RoPE on the last 8 (interleaved), "
            "one K=V head, sinks, o_groups 2 x o_lora_rank 16; 8 experts (FFN 32) top-2, sqrt-softplus "
            "scores with a correction bias, routed scaling 1.5, SwiGLU clamped at 2, 1 shared expert; "
            "layers 0-1 routed by a random tid2eid table"
        ),
    ),
}


@torch.no_grad()
def v4_post_init(model):
    """Mixing weights that vary per row, a hash table of distinct experts per token, a
    correction bias that changes choices, experts whose gate and up often pass the clamp."""
    cfg = model.config
    g = torch.Generator().manual_seed(cfg.vocab_size)
    hc = [m for layer in model.model.layers for m in (layer.attn_hc, layer.ffn_hc)]
    for m in hc:
        m.fn.normal_(0.0, 1.0 / math.sqrt(m.fn.shape[-1]))
        m.base.normal_(0.0, 0.5)
        m.scale.uniform_(0.5, 1.5)
    head = model.model.hc_head
    head.hc_fn.normal_(0.0, 1.0 / math.sqrt(head.hc_fn.shape[-1]))
    head.hc_base.normal_(0.0, 0.5)
    head.hc_scale.uniform_(0.5, 1.5)
    for layer in model.model.layers:
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            rows = [torch.randperm(cfg.n_routed_experts, generator=g)[: cfg.num_experts_per_tok] for _ in range(cfg.vocab_size)]
            gate.tid2eid.copy_(torch.stack(rows))
        else:
            gate.e_score_correction_bias.normal_(0.0, 0.1)
        ex = layer.mlp.experts
        ex.gate_up_proj.normal_(0.0, 2.0 / math.sqrt(ex.gate_up_proj.shape[-1]))
        ex.down_proj.normal_(0.0, 1.0 / math.sqrt(ex.down_proj.shape[-1]))


def v4_router_gap(model, entries, top_k):
    """The k-th minus the (k+1)-th choice score (sqrt(softplus(logit)) + bias) at every routing
    decision of a top-k layer; a hash layer's experts come from its table."""
    gap = math.inf
    for layer, logits in entries:
        gate = model.model.layers[layer].mlp.gate
        if hasattr(gate, "tid2eid"):
            continue
        choice = torch.nn.functional.softplus(logits).sqrt() + gate.e_score_correction_bias.float()
        v = choice.topk(top_k + 1, dim=-1).values
        gap = min(gap, float((v[:, top_k - 1] - v[:, top_k]).min()))
    return gap


V4["deepseek_v4"]["post_init"] = v4_post_init
V4["deepseek_v4"]["router_gap"] = v4_router_gap


# DeepSeek V4 with its compressed layers: heavily compressed attention (HCA: one entry per
# window of `compress_rates` positions, every closed window visible) and compressed sparse
# attention (CSA: overlapping windows, the lightning indexer's top-k of them), beside the
# sliding window; the compressed layers' RoPE is the "compress" one (theta 160000, YaRN).
V4["deepseek_v4_compressed"] = dict(
    V4["deepseek_v4"],
    seed=14600,
    prompt_len=22,
    attempts=200,
    config=dict(
        V4["deepseek_v4"]["config"],
        hidden_size=48,
        num_hidden_layers=4,
        num_attention_heads=3,
        head_dim=24,
        q_lora_rank=24,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 3, "heavily_compressed_attention": 5},
        compress_rope_theta=160000.0,
        # YaRN on the compressed layers only (V4's published configuration has factor 16).
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        index_n_heads=8,
        index_head_dim=8,
        index_topk=3,
        hc_mult=3,
        o_groups=3,
        o_lora_rank=8,
        n_routed_experts=6,
    ),
    note=(
        "DeepSeek V4 with compressed layers: HCA (rate 5), CSA (rate 3, overlapping windows, lightning "
        "indexer 8 heads x 8, top-3), sliding, CSA; window 4, hidden 48, 3 hyper-connection streams, "
        "3 heads x 24 with RoPE on the last 6, compress RoPE theta 160000 with YaRN (factor 4, original 16, "
        "attention factor 1), o_groups 3 x 8; 6 experts top-2, "
        "layer 0 routed by a hash table"
    ),
)


MIN_INDEX_GAP = 2e-4


@torch.no_grad()
def compressed_index_gap(model, ids):
    """The smallest k-th minus (k+1)-th lightning-indexer score over every CSA layer and every
    row of a no-cache forward that sees more than index_topk closed windows."""
    cfg = model.config
    rate, k = cfg.compress_rates["compressed_sparse_attention"], cfg.index_topk
    scores = []
    hooks = [layer.self_attn.compressor.indexer.scorer.register_forward_hook(lambda m, i, o: scores.append(o[0]))
             for layer in model.model.layers if layer.self_attn.layer_type == "compressed_sparse_attention"]
    model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    gap = math.inf
    for sc in scores:
        for s in range(sc.shape[0]):
            seen = (s + 1) // rate
            if seen > k:
                v = sc[s, :seen].float().topk(k + 1).values
                gap = min(gap, float(v[k - 1] - v[k]))
    return gap


def compressed_accept(model, prompt, greedy):
    gap = compressed_index_gap(model, prompt + greedy[:-1])
    return gap >= MIN_INDEX_GAP, f"index gap {gap:.5f}"


V4["deepseek_v4_compressed"]["accept"] = compressed_accept

# The compressed layers at the rate the original checkpoints' `compress_ratios` give the
# compressed sparse ones (4: the overlapping windows and the indexer belong to that rate, so a
# `deepseek4` GGUF file states them), the heavily compressed ones at 8 (the checkpoints' 128
# would close no window within the prompt).
V4["deepseek_v4_csa4"] = dict(
    V4["deepseek_v4_compressed"],
    seed=14800,
    config=dict(
        V4["deepseek_v4_compressed"]["config"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    ),
    note=(
        "DeepSeek V4 with compressed layers at the rates of the original checkpoints' kinds: HCA (rate 8), "
        "CSA (rate 4, overlapping windows, lightning indexer 8 heads x 8, top-3), sliding, CSA; otherwise "
        "as deepseek_v4_compressed"
    ),
)
for _name in ("deepseek_v4_compressed", "deepseek_v4_csa4"):
    V4[_name]["probe"] = lambda model, ids: {
        "index_note": "min over prompt + greedy[:-1] (no-cache forward) and every CSA layer of the k-th minus the (k+1)-th indexer score, at rows that see more than index_topk closed windows",
        "min_index_score_gap": compressed_index_gap(model, ids),
    }
