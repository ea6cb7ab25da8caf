"""The tiny fixtures of the mixers beyond plain attention (gpt-oss and MiMo-V2-Flash: sliding
window with sinks; DeepSeek-V3: multi-head latent attention; Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet;
Kimi Linear: Kimi Delta Attention beside MLA without RoPE; Inkling: sliding and global attention with
relative-position logits and short convolutions), for
make_fixtures.py:
their configurations, the hooks that make their random weights well conditioned, and the tensor
names save_pretrained must write. Imported by make_fixtures.py; not a script of its own.
"""

import math

import torch

MIXERS = {
    # gpt-oss: alternating sliding (window 4) and full attention, sinks, attention biases,
    # router with a bias, fused input-major experts with biases and the clamped SwiGLU,
    # YaRN RoPE (the configuration's default: factor 32, truncate false).
    "gpt_oss": dict(
        cls="GptOssForCausalLM",
        seed=6000,
        fused=True,
        config=dict(
            vocab_size=288,
            hidden_size=64,
            intermediate_size=40,  # != hidden: gate_up_proj [6, 64, 80], down_proj [6, 40, 64]
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attention_bias=True,
            tie_word_embeddings=False,
            output_router_logits=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "gpt-oss, 3 layers (sliding window 4, full, sliding window 4), sinks per head, q/k/v/o biases, "
            "GQA 4/2, head_dim 16, YaRN RoPE (factor 32, original 4096, truncate false, theta 150000), "
            "6 experts top-2 (router with bias, softmax over the top-2), fused input-major experts "
            "gate_up_proj [6, 64, 80] (gate/up interleaved) and down_proj [6, 40, 64] with biases, "
            "clamped SwiGLU (limit 7, alpha 1.702; gate_up gain 3 so that some values clamp)"
        ),
    ),
    # DeepSeek-V3: MLA with a query LoRA, YaRN (mscale != mscale_all_dim, so both the
    # attention factor and the softmax scale move), interleaved rope pairs; first layer dense;
    # sigmoid router with a (random) correction bias, 4 groups of 2 experts, top-2 groups,
    # top-2 experts, renormalised and scaled by 2.5; one shared expert.
    "deepseek_v3": dict(
        cls="DeepseekV3ForCausalLM",
        seed=7000,
        config=dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=48,
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
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 0.707},
            rope_interleave=True,
            attention_bias=False,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "DeepSeek-V3, 3 layers (first dense, FFN 96), hidden 64, MLA with 4 heads, q_lora_rank 48, "
            "kv_lora_rank 32, qk_nope 16, qk_rope 8 (interleaved pairs), v_head_dim 12, YaRN factor 4 "
            "(original 64, mscale 1, mscale_all_dim 0.707), 8 routed experts (FFN 24) in 4 groups, top-2 groups, "
            "top-2 experts, sigmoid scores with a random e_score_correction_bias, renormalised, x2.5, "
            "1 shared expert"
        ),
    ),
    # DeepSeek-V2: the same MLA (here without a query LoRA, as V2-Lite) and the softmax router:
    # group-limited greedy by each group's best score, no renormalisation, a routed scale.
    "deepseek_v2": dict(
        cls="DeepseekV2ForCausalLM",
        seed=7500,
        config=dict(
            vocab_size=288,
            hidden_size=48,
            intermediate_size=80,
            moe_intermediate_size=20,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=3,
            q_lora_rank=None,
            kv_lora_rank=24,
            qk_nope_head_dim=12,
            qk_rope_head_dim=8,
            v_head_dim=10,
            n_routed_experts=12,
            n_shared_experts=2,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            topk_method="group_limited_greedy",
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            first_k_dense_replace=1,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attention_bias=False,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "DeepSeek-V2, 3 layers (first dense, FFN 80), hidden 48, MLA with 3 heads and no query LoRA, "
            "kv_lora_rank 24, qk_nope 12, qk_rope 8 (interleaved pairs), v_head_dim 10, 12 routed experts "
            "(FFN 20) in 4 groups, group_limited_greedy keeping 2 groups by their best softmax score, top-3, "
            "not renormalised, x1.5, 2 shared experts"
        ),
    ),
    # Qwen3-Next: Gated DeltaNet layers (2 key heads, 4 value heads, conv 4) and gated full
    # attention (partial RoPE 0.25 of head_dim 32, per-head q/k norm) by layer_types; one dense
    # layer (mlp_only_layers); MoE with a sigmoid-gated shared expert.
    "qwen3_next": dict(
        cls="Qwen3NextForCausalLM",
        seed=8000,
        config=dict(
            vocab_size=352,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            partial_rotary_factor=0.25,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=12,
            linear_conv_kernel_dim=4,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            tie_word_embeddings=False,
            attention_bias=False,
            output_router_logits=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "Qwen3-Next, 4 layers (Gated DeltaNet, DeltaNet with a dense FFN 96, gated attention, DeltaNet), "
            "hidden 64; DeltaNet 2 key heads x 16, 4 value heads x 12, conv kernel 4, A in [0.05, 1]; "
            "attention 4 q / 2 kv heads, head_dim 32, partial RoPE 8 of 32 (theta 1e4), q/k RMSNorm per head, "
            "sigmoid output gate; 8 experts (FFN 32) top-2 renormalised plus a shared expert (FFN 48) with a "
            "sigmoid gate; zero-centred RMSNorms (1 + w, w drawn in [-0.3, 0.3])"
        ),
    ),
    # Qwen3.5-MoE (the text model's causal LM): Qwen3-Next's layers with the DeltaNet's
    # projections apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, not grouped per key
    # head), every layer sparse, the router always renormalised, the experts fused in memory
    # (saved per expert); text-only positions make its multimodal RoPE plain partial RoPE.
    "qwen3_5_moe": dict(
        cls="Qwen3_5MoeForCausalLM",
        seed=8500,
        config=dict(
            vocab_size=336,
            hidden_size=72,
            moe_intermediate_size=40,
            shared_expert_intermediate_size=56,
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            linear_num_key_heads=2,
            linear_num_value_heads=6,
            linear_key_head_dim=12,
            linear_value_head_dim=10,
            linear_conv_kernel_dim=4,
            num_experts=6,
            num_experts_per_tok=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 1], "mrope_interleaved": True},
            tie_word_embeddings=False,
            attention_bias=False,
            output_router_logits=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "Qwen3.5-MoE (Qwen3_5MoeForCausalLM), 4 layers (Gated DeltaNet x3, gated attention), hidden 72; "
            "DeltaNet 2 key heads x 12, 6 value heads x 10 (3 per key head), conv kernel 4, projections "
            "in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, A in [0.05, 1]; attention 4 q / 2 kv heads, "
            "head_dim 24, partial RoPE 6 of 24 (theta 1e4; text positions, so mrope is plain RoPE), q/k RMSNorm "
            "per head, sigmoid output gate; every layer 6 experts (FFN 40) top-2 renormalised plus a "
            "shared expert (FFN 56) with a sigmoid gate; zero-centred RMSNorms (1 + w, w drawn in [-0.3, 0.3])"
        ),
    ),
    # Kimi Linear: KDA layers (the channel-wise gated delta rule: q/k/v each with its own short
    # convolution, a per-channel decay from f_a/f_b, beta per head, a sigmoid-gated output norm
    # from g_a/g_b) and MLA layers that rotate nothing (NoPE; the shared rope key still takes
    # part in the scores), as linear_attn_config says (1-indexed full_attn_layers); the first
    # layer dense (first_k_dense_replace), then sigmoid routing with a correction bias,
    # renormalised and scaled, plus one shared expert. The experts are fused in memory and saved
    # per expert under the published checkpoint's names (block_sparse_moe.experts.{e}.w1/w2/w3).
    "kimi_linear": dict(
        cls="KimiLinearForCausalLM",
        seed=9500,
        config=dict(
            vocab_size=304,
            hidden_size=72,
            intermediate_size=88,
            moe_intermediate_size=24,
            num_hidden_layers=4,
            num_attention_heads=3,
            num_key_value_heads=3,
            q_lora_rank=None,
            kv_lora_rank=20,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=12,
            linear_attn_config={"full_attn_layers": [3], "kda_layers": [1, 2, 4], "head_dim": 14,
                                "num_heads": 3, "short_conv_kernel_size": 4},
            num_experts=6,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.446,
            first_k_dense_replace=1,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            attention_bias=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "Kimi Linear (KimiLinearForCausalLM), 4 layers by linear_attn_config (KDA, KDA, MLA, KDA), hidden 72; "
            "KDA 3 heads x 14, q/k/v short convolutions of kernel 4, per-channel decay (f_a 14, f_b 42, "
            "A in [0.05, 1]), beta per head, sigmoid output gate (g_a 14, g_b 42), gated RMSNorm eps 1e-5; "
            "MLA 3 heads, no q LoRA, kv_lora 20, nope 16, rope part 8 not rotated (NoPE), v 12; first layer "
            "dense (FFN 88), then 6 experts (FFN 24) top-2, sigmoid scores with a random "
            "e_score_correction_bias, renormalised, x2.446, 1 shared expert (FFN 24)"
        ),
    ),
    # MiMo-V2-Flash: full and sliding (window 4, twice the KV heads, sinks) layers by layer_types,
    # each type with its own RoPE theta, partial RoPE (int(32 * 0.334) = 10 of 32 dims), value
    # heads narrower than the key heads (16 vs 32), values scaled by attention_value_scale; a
    # dense first layer (mlp_layer_types), then sigmoid routing with a correction bias
    # (DeepSeek-style, one group), renormalised and scaled, and no shared experts.
    "mimo_v2_flash": dict(
        cls="MiMoV2FlashForCausalLM",
        seed=9000,
        config=dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=16,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,  # sliding layers: 2
            head_dim=32,
            v_head_dim=16,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334},
            },
            attention_value_scale=0.707,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            attention_bias=False,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "MiMo-V2-Flash, 4 layers (full, sliding window 4, sliding 4, full by layer_types), hidden 64, "
            "4 q heads over 1 kv head (full) or 2 (sliding, with sinks), head_dim 32, v_head_dim 16, "
            "partial RoPE 10 of 32 (int(32 * 0.334)), theta 5e6 (full) / 1e4 (sliding), values x0.707; "
            "first layer dense (FFN 96), then 6 experts (FFN 16) top-2, sigmoid scores with a random "
            "e_score_correction_bias, renormalised, x1.5, no shared experts"
        ),
    ),
    # Inkling: global ("hybrid") and sliding ("hybrid_sliding", window 4) layers by layer_types,
    # each with its own head counts and widths, no RoPE but relative-position logits (r_proj's
    # d_rel states per head mixed with a [d_rel, extent] bank: extent rel_extent 6 in the global
    # layers, the window in the sliding ones), q/k RMSNorm per head, scale 1/head_dim; short
    # convolutions (kernel 4, plus their input) on k and v, on the attention output and on the MLP
    # output; an embedding norm; a dense first layer with its global scale, then sigmoid routing
    # with a correction bias, weights normalised over the top-2 and the 2 shared experts (the
    # sink), x route_scale x the router's global scale; logits of the final norm / 3.
    "inkling": dict(
        cls="InklingForCausalLM",
        seed=9700,
        fused=True,
        config=dict(
            vocab_size=304,
            hidden_size=68,
            intermediate_size=88,
            moe_intermediate_size=20,
            num_hidden_layers=4,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=16,
            swa_num_attention_heads=4,
            swa_num_key_value_heads=2,
            swa_head_dim=12,
            sliding_window_size=4,
            d_rel=5,
            rel_extent=6,
            layer_types=["hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            conv_kernel_size=4,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_shared_experts=2,
            route_scale=2.5,
            logits_mup_width_multiplier=3.0,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
        note=(
            "Inkling (InklingForCausalLM), 4 layers (global, sliding window 4, sliding 4, global by layer_types), "
            "hidden 68; global 3 q heads / 1 kv head x 16, sliding 4 / 2 x 12; no RoPE, relative logits "
            "(d_rel 5; extent 6 global, 4 sliding), q/k RMSNorm per head, scale 1/head_dim; short convolutions "
            "of kernel 4 with their input added (k, v, attention output, MLP output); embedding RMSNorm; first "
            "layer dense (FFN 88) with a global scale, then 6 experts (FFN 20, fused gate_up) top-2, sigmoid "
            "choice with a random e_score_correction_bias, weights over the top-2 and 2 shared experts (FFN 20), "
            "x2.5 x the router's global scale; final hidden / 3 before the head"
        ),
    ),
}


@torch.no_grad()
def gpt_oss_probe(model, ids):
    """How often the clamped SwiGLU clamps, over the routed (token, expert) pairs of a forward."""
    counts = {"gate_above_limit": 0, "up_outside_limit": 0, "values": 0}

    def hook(mod, inp, _out):
        x, idx = inp[0], inp[1]
        for t in range(x.shape[0]):
            for e in idx[t].tolist():
                gu = x[t] @ mod.gate_up_proj[e] + mod.gate_up_proj_bias[e]
                gate, up = gu[::2], gu[1::2]
                counts["gate_above_limit"] += int((gate > mod.limit).sum())
                counts["up_outside_limit"] += int((up.abs() > mod.limit).sum())
                counts["values"] += gate.numel()

    hs = [layer.mlp.experts.register_forward_hook(hook) for layer in model.model.layers]
    model(input_ids=torch.tensor([ids]))
    for h in hs:
        h.remove()
    return {"clamp_note": "routed gate values above the limit / up values outside [-limit, limit] / all routed gate values, over a no-cache forward of prompt + greedy[:-1]", "clamp_counts": counts}


MIXERS["gpt_oss"]["probe"] = gpt_oss_probe


@torch.no_grad()
def deepseek_post_init(model):
    """A correction bias that changes choices (transformers initialises it to zeros)."""
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            gate.e_score_correction_bias.normal_(0.0, 0.1)


def deepseek_router_gap(model, entries, top_k):
    """The smallest margin of a routing decision as DeepSeek-V3 makes it: the topk_group-th
    minus the next group score, and the k-th minus the (k+1)-th choice score in the kept groups."""
    gap = math.inf
    cfg = model.config
    for layer, logits in entries:
        bias = model.model.layers[layer].mlp.gate.e_score_correction_bias.float()
        choice = logits.sigmoid() + bias
        groups = choice.view(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group).topk(2, dim=-1)[0].sum(-1)
        if cfg.topk_group < cfg.n_group:
            g = groups.topk(cfg.topk_group + 1, dim=-1).values
            gap = min(gap, float((g[:, -2] - g[:, -1]).min()))
        keep = groups.topk(cfg.topk_group, dim=-1).indices
        mask = torch.zeros_like(groups).scatter_(1, keep, 1).bool()
        mask = mask.unsqueeze(-1).expand(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group).reshape(choice.shape)
        v = choice.masked_fill(~mask, float("-inf")).topk(top_k + 1, dim=-1).values
        gap = min(gap, float((v[:, top_k - 1] - v[:, top_k]).min()))
    return gap


MIXERS["deepseek_v3"]["post_init"] = deepseek_post_init


@torch.no_grad()
def deepseek_v2_post_init(model):
    """The experts are output-major in memory ([E, 2F, H], [E, H, F]): std 1/sqrt(fan_in)."""
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            experts.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(experts.gate_up_proj.shape[-1]))
            experts.down_proj.normal_(0.0, 1.0 / math.sqrt(experts.down_proj.shape[-1]))


def deepseek_v2_router_gap(model, entries, top_k):
    """The smallest margin of a routing decision as DeepSeek-V2's group-limited greedy makes it:
    the topk_group-th minus the next group's best softmax score, and the k-th minus the
    (k+1)-th score in the kept groups."""
    gap = math.inf
    cfg = model.config
    for _layer, logits in entries:
        scores = logits.float().softmax(dim=-1)
        groups = scores.view(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group).max(dim=-1).values
        if cfg.topk_group < cfg.n_group:
            g = groups.topk(cfg.topk_group + 1, dim=-1).values
            gap = min(gap, float((g[:, -2] - g[:, -1]).min()))
        keep = groups.topk(cfg.topk_group, dim=-1).indices
        mask = torch.zeros_like(groups).scatter_(1, keep, 1).bool()
        mask = mask.unsqueeze(-1).expand(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group).reshape(scores.shape)
        v = scores.masked_fill(~mask, float("-inf")).topk(top_k + 1, dim=-1).values
        gap = min(gap, float((v[:, top_k - 1] - v[:, top_k]).min()))
    return gap


MIXERS["deepseek_v2"]["post_init"] = deepseek_v2_post_init
MIXERS["deepseek_v2"]["router_gap"] = deepseek_v2_router_gap


@torch.no_grad()
def qwen3_next_post_init(model):
    """Zero-centred norms (x / rms * (1 + w)): draw w around 0, not around 1."""
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("_norm.weight") or name == "model.norm.weight":
            p.uniform_(-0.3, 0.3)


MIXERS["qwen3_next"]["post_init"] = qwen3_next_post_init


@torch.no_grad()
def qwen3_5_moe_post_init(model):
    """Zero-centred norms as Qwen3-Next's; the experts are output-major in memory ([E, 2F, H],
    [E, H, F]): std 1/sqrt(fan_in) of the last dimension."""
    qwen3_next_post_init(model)
    for layer in model.model.layers:
        experts = layer.mlp.experts
        experts.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(experts.gate_up_proj.shape[-1]))
        experts.down_proj.normal_(0.0, 1.0 / math.sqrt(experts.down_proj.shape[-1]))


MIXERS["qwen3_5_moe"]["post_init"] = qwen3_5_moe_post_init

@torch.no_grad()
def mimo_post_init(model):
    """The experts are output-major in memory ([E, 2F, H], [E, H, F]): std 1/sqrt(fan_in) of the
    last dimension (the generic re-initialisation treats `gate_up_proj` as gpt-oss's input-major
    tensor); a correction bias that changes choices, as for DeepSeek-V3."""
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            experts.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(experts.gate_up_proj.shape[-1]))
            experts.down_proj.normal_(0.0, 1.0 / math.sqrt(experts.down_proj.shape[-1]))
    deepseek_post_init(model)


MIXERS["mimo_v2_flash"]["post_init"] = mimo_post_init
MIXERS["mimo_v2_flash"]["router_gap"] = deepseek_router_gap
MIXERS["deepseek_v3"]["router_gap"] = deepseek_router_gap


@torch.no_grad()
def kimi_linear_post_init(model):
    """Output-major fused experts and a correction bias, as for MiMo-V2-Flash; the forget
    gate's decay rates exp(A_log) in [0.05, 1] and dt_bias N(0, 0.5), so the state remembers
    a while (transformers' own init draws A in [1, 16])."""
    mimo_post_init(model)
    for layer in model.model.layers:
        fg = getattr(layer.self_attn, "forget_gate", None)
        if fg is not None:
            fg.A_log.copy_(torch.empty_like(fg.A_log).uniform_(0.05, 1.0).log())
            fg.dt_bias.normal_(0.0, 0.5)


def kimi_linear_router_gap(model, entries, top_k):
    """The smallest k-th minus (k+1)-th choice score (sigmoid plus the correction bias; one group)."""
    gap = math.inf
    for layer, logits in entries:
        bias = model.model.layers[layer].mlp.gate.e_score_correction_bias.float()
        v = (logits.sigmoid() + bias).topk(top_k + 1, dim=-1).values
        gap = min(gap, float((v[:, top_k - 1] - v[:, top_k]).min()))
    return gap


MIXERS["kimi_linear"]["post_init"] = kimi_linear_post_init
MIXERS["kimi_linear"]["router_gap"] = kimi_linear_router_gap


@torch.no_grad()
def inkling_post_init(model):
    """Output-major fused experts and a correction bias, as for MiMo-V2-Flash; the global
    scales of the dense MLP and of the router away from 1; the short convolutions' taps
    N(0, 0.3) (their input passes through beside them)."""
    mimo_post_init(model)
    for name, p in model.named_parameters():
        if name.endswith("global_scale"):
            p.uniform_(0.6, 1.4)
        if name.endswith("sconv.conv1d.weight"):
            p.normal_(0.0, 0.3)


MIXERS["inkling"]["post_init"] = inkling_post_init
MIXERS["inkling"]["router_gap"] = kimi_linear_router_gap


def mixer_names(name, cfg, n_layers):
    """The HF names save_pretrained must produce for these families."""
    out = []
    if name in ("deepseek_v3", "deepseek_v2"):
        for i in range(cfg["first_k_dense_replace"], n_layers):
            if name == "deepseek_v3":
                out.append(f"model.layers.{i}.mlp.gate.e_score_correction_bias")
            out.append(f"model.layers.{i}.mlp.shared_experts.gate_proj.weight")
            for e in range(cfg["n_routed_experts"]):
                for w in ("gate_proj", "up_proj", "down_proj"):
                    out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    if name == "qwen3_next":
        for i, t in enumerate(cfg["layer_types"]):
            if t == "linear_attention":
                for w in ("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"):
                    out.append(f"model.layers.{i}.linear_attn.{w}")
            if i not in cfg["mlp_only_layers"]:
                out.append(f"model.layers.{i}.mlp.shared_expert_gate.weight")
                for e in range(cfg["num_experts"]):
                    for w in ("gate_proj", "up_proj", "down_proj"):
                        out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    if name == "qwen3_5_moe":
        for i, t in enumerate(cfg["layer_types"]):
            if t == "linear_attention":
                for w in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                          "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"):
                    out.append(f"model.layers.{i}.linear_attn.{w}")
            for w in ("gate.weight", "shared_expert_gate.weight"):
                out.append(f"model.layers.{i}.mlp.{w}")
            for e in range(cfg["num_experts"]):
                for w in ("gate_proj", "up_proj", "down_proj"):
                    out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    if name == "kimi_linear":
        full = set(cfg["linear_attn_config"]["full_attn_layers"])
        for i in range(n_layers):
            if i + 1 not in full:
                for w in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
                          "v_conv1d.weight", "f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log",
                          "b_proj.weight", "g_a_proj.weight", "g_b_proj.weight", "o_norm.weight", "o_proj.weight"):
                    out.append(f"model.layers.{i}.self_attn.{w}")
            else:
                out.append(f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight")
            if i >= cfg["first_k_dense_replace"]:
                out.append(f"model.layers.{i}.block_sparse_moe.gate.e_score_correction_bias")
                out.append(f"model.layers.{i}.block_sparse_moe.shared_experts.gate_proj.weight")
                for e in range(cfg["num_experts"]):
                    for w in ("w1", "w2", "w3"):
                        out.append(f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight")
    if name == "inkling":
        for i in range(n_layers):
            for w in ("r_proj.weight", "rel_logits_proj.proj", "k_sconv.conv1d.weight", "v_sconv.conv1d.weight",
                      "q_norm.weight", "k_norm.weight"):
                out.append(f"model.layers.{i}.self_attn.{w}")
            for w in ("attn_sconv.conv1d.weight", "mlp_sconv.conv1d.weight"):
                out.append(f"model.layers.{i}.{w}")
            if cfg["mlp_layer_types"][i] == "sparse":
                for w in ("gate.weight", "gate.global_scale", "gate.e_score_correction_bias",
                          "experts.gate_up_proj", "experts.down_proj", "shared_experts.gate_proj",
                          "shared_experts.up_proj", "shared_experts.down_proj"):
                    out.append(f"model.layers.{i}.mlp.{w}")
            else:
                out.append(f"model.layers.{i}.mlp.global_scale")
        out.append("model.embed_norm.weight")
    if name == "mimo_v2_flash":
        for i, t in enumerate(cfg["layer_types"]):
            if t == "sliding_attention":
                out.append(f"model.layers.{i}.self_attn.attention_sink_bias")
            if cfg["mlp_layer_types"][i] == "sparse":
                out.append(f"model.layers.{i}.mlp.gate.e_score_correction_bias")
                for e in range(cfg["n_routed_experts"]):
                    for w in ("gate_proj", "up_proj", "down_proj"):
                        out.append(f"model.layers.{i}.mlp.experts.{e}.{w}.weight")
    if name == "gpt_oss":
        for i in range(n_layers):
            out.append(f"model.layers.{i}.self_attn.sinks")
            out.append(f"model.layers.{i}.mlp.router.bias")
            for w in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
                out.append(f"model.layers.{i}.mlp.experts.{w}")
    return out


# `attention_bias` on, small: Qwen3-Next's biases on the fused query-and-gate projection (the
# bias rows selected as the matrix's), k, v and o; DeepSeek-V3's on the MLA's q_a, kv_a and o.
def biased(name, seed, note, **config):
    spec = dict(MIXERS[name])
    spec["config"] = {**MIXERS[name]["config"], "attention_bias": True, **config}
    spec.update(seed=seed, note=note, check_names=False)
    return spec


MIXERS["qwen3_next_bias"] = biased(
    "qwen3_next", 8600,
    "Qwen3-Next with attention_bias: 3 layers (DeltaNet, gated attention with biases on q/gate, k, v, o, "
    "DeltaNet), hidden 32, 4 q / 2 kv heads of 16, 6 experts (FFN 16) top-2 plus a shared expert (FFN 24)",
    vocab_size=160, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"], head_dim=16,
    linear_key_head_dim=8, linear_value_head_dim=8, num_experts=6, mlp_only_layers=[])
MIXERS["deepseek_v3_bias"] = biased(
    "deepseek_v3", 7600,
    "DeepSeek-V3 with attention_bias: 2 layers (dense, MoE), hidden 32, MLA 2 heads with q_lora_rank 24 and "
    "biases on q_a, kv_a and o, kv_lora_rank 16, qk_nope 8, qk_rope 8, v_head_dim 8, 6 experts (FFN 16) in 2 "
    "groups, top-2",
    vocab_size=160, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=6, n_group=2, topk_group=1)
