#!/usr/bin/env python3
"""Makes tests/fixtures/gguf_mixers/: the tiny Hugging Face fixtures of the mixers beyond plain
attention (tests/fixtures/<name>/, F32 safetensors) written as GGUF files laid out the way
llama.cpp's own converter lays them out: its architecture name, the metadata keys of that
architecture, its tensor names, and the transforms it applies to the tensors.

- deepseek_v3 -> deepseek2.gguf (`deepseek2`): the experts stacked per layer, `kv_b_proj`
  split per head into `attn_k_b` (the key rows, transposed: [heads, kv_lora, nope]) and
  `attn_v_b` ([heads, v, kv_lora]); `e_score_correction_bias` as `exp_probs_b.bias`; the KV
  head count 1 (MLA as multi-query over the latent); YaRN's `mscale_all_dim` as
  `rope.scaling.yarn_log_multiplier` (times 0.1, as the converter writes it). The gating
  function is written as sigmoid (DeepSeek-V3's `scoring_func`, which transformers 5 does not
  save into the fixture's configuration).
- deepseek_v2 -> deepseek2-v2.gguf (`deepseek2`, as the converter writes DeepSeek-V2 and
  V2-Lite): the same layout, the softmax gating function, no correction bias, no
  `expert_weights_norm` (V2 does not renormalize).
- gpt_oss -> gpt-oss.gguf (`gpt-oss`): the fused input-major experts transposed to
  output-major and `gate_up` split into gate (even columns) and up (odd), their biases
  likewise; sinks as `attn_sinks.weight`; the router's bias as `ffn_gate_inp.bias`;
  `post_attention_layernorm` as `post_attention_norm`.

- mimo_v2_flash -> mimo2.gguf (`mimo2`): the KV head count and the sliding pattern as
  per-layer lists (`head_count_kv`, `sliding_window_pattern`), counting the 3 MTP blocks the
  converter always declares (`nextn_predict_layers`; their tensors are absent, as in a file
  converted without them); the sliding layers' theta as `rope.freq_base_swa`; sinks as
  `attn_sinks.weight`; `e_score_correction_bias` as `exp_probs_b.bias`. llama.cpp's mimo2 has
  no key for `routed_scaling_factor` (it scales by 1, as MiMo-V2-Flash's null says).

- qwen3_next -> qwen3next.gguf (`qwen3next`): every `*norm.weight` but the Gated DeltaNet's
  `linear_attn.norm.weight` plus 1 (llama.cpp's RMSNorm multiplies by the weight alone);
  `in_proj_qkvz` (per key head q, k, its values, their gates z) split into `attn_qkv` (every q,
  every k, every v) and `attn_gate` (every z); `A_log` as `ssm_a` = -exp(A_log); `dt_bias` as
  `ssm_dt.bias`; the convolution squeezed to [channels, kernel]; `in_proj_ba` as `ssm_ba`
  (unchanged); the experts stacked; `full_attention_interval` read back from `layer_types`.
  llama.cpp's qwen3next has no dense layer, so the fixture's `mlp_only_layers` get a sparse block
  of seeded weights, written also as qwen3next-moe.safetensors (the test's reference reads it as
  a second shard of the fixture).
- qwen3_5_moe -> qwen35moe.gguf (`qwen35moe`): Qwen3-Next's transforms (the projections are
  apart already: `in_proj_qkv` as `attn_qkv`, `in_proj_z` as `attn_gate`, `in_proj_b` /
  `in_proj_a` as `ssm_beta` / `ssm_alpha`) and, with more value than key heads, every value-head
  dimension re-laid from grouped by key head to tiled (the value rows of `attn_qkv`, `attn_gate`,
  `ssm_beta`, `ssm_alpha`, `ssm_dt`, `ssm_a`, the convolution's value channels, the columns of
  `ssm_out`); `mrope_section` as `rope.dimension_sections` (padded to 4).
- kimi_linear -> kimi-linear.gguf (`kimi-linear`): `head_count_kv` per layer (1 for MLA, as MQA
  over the latent; 0 for KDA), `kv_b_proj` split as deepseek2's, `A_log` as `ssm_a` =
  -exp(A_log) ([1, 1, heads, 1]), the q/k/v convolutions as [1, channels, 1, kernel],
  `dt_bias` as `ssm_dt.bias`, the experts (`w1`/`w2`/`w3`) stacked, `e_score_correction_bias` as
  `exp_probs_b.bias`; the dense FFN, which transformers 5 saves under `block_sparse_moe.`, under
  the remote code's `mlp.` names the converter maps; the gating function sigmoid (Kimi-Linear's
  `moe_router_activation_func`, which transformers 5 does not save into the fixture).
- mixtral -> mixtral.gguf (`llama`, as the converter writes Mixtral): `llama.expert_count`, the
  q and k rows permuted per head for interleaved RoPE, `w1`/`w2`/`w3` stacked as
  `ffn_gate_exps`/`ffn_down_exps`/`ffn_up_exps`, the router as `ffn_gate_inp`.
- glm_moe_dsa -> glm-dsa.gguf (`glm-dsa`, the converter's DeepSeek-V2 class): deepseek2.gguf's
  layout, the indexer's tensors as `blk.N.indexer.attn_q_b` / `attn_k` / `k_norm` (weight and
  bias) / `proj`, its geometry as `attention.indexer.head_count` / `key_length` / `top_k`,
  `indexer_types` as the Bools `attention.indexer.types` (true: full).
- deepseek_v32 -> deepseek32.gguf (`deepseek32`): glm-dsa.gguf's layout without `indexer_types`
  (every layer has its indexer), YaRN as deepseek2.gguf's.
- qwen3_5_moe_mtp -> qwen35moe-mtp.gguf: qwen35moe.gguf's transforms with the MTP module as one
  more block (`block_count` 3, `nextn_predict_layers` 1): its layer as `blk.2.*`, `mtp.fc` /
  `pre_fc_norm_embedding` / `pre_fc_norm_hidden` / `norm` as `blk.2.nextn.eh_proj` / `enorm` /
  `hnorm` / `shared_head_norm`, the norms plus 1 as every zero-centred norm (llama.cpp's qwen35moe
  MTP graph multiplies by them alone).
- deepseek_v32_mtp -> deepseek32-mtp.gguf: the same with its MTP block, as glm-dsa-mtp.gguf's.
- deepseek_v4 -> deepseek4.gguf (`deepseek4`, as the converter writes DeepSeek V4's original
  checkpoints): the tensors under llama.cpp's names (the names transformers saves map to the
  original ones: `embed_tokens` is `embed`, `hc_head.hc_fn` is `hc_head_fn`, `attn.norm` is
  `attn.kv_norm`), none transposed; the experts (`w1`/`w3`/`w2`) stacked; `tid2eid` as I32; the
  converter's keys from the original configuration, which transformers folds into its own and
  the tool unfolds: `compress_ratios` per layer (then 0 for each MTP layer, whose tensors the
  converter leaves out; `block_count` counts the others), `num_hash_layers` as
  `hash_layer_count`, `rope_scaling` (the compress parameters' YaRN without the attention
  factor 1 transformers adds) as `rope.scaling.*`; `swiglu_limit` once per layer as
  `swiglu_clamp_exp`; `scoring_func` as `expert_gating_func`.
- deepseek_v4_csa4 -> deepseek4-compressed.gguf: the same with compressed layers (the format
  tells them apart by the rate alone: 4 is compressed sparse, so `deepseek_v4_compressed`, at 3,
  cannot be written).
- glm_moe_dsa_mtp -> glm-dsa-mtp.gguf: the same with the MTP block (`block_count` 3,
  `nextn_predict_layers` 1): its layer as `blk.2.*` and its own tensors as `blk.2.nextn.enorm` /
  `hnorm` / `eh_proj` / `shared_head_norm` / `shared_head_head` (no `embed_tokens`, as the
  checkpoint has none).

Every tensor is F32, as the converter writes with `--outtype f32`. Each file carries a minimal
SentencePiece-style vocabulary (`<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `t<id>`) only
so that llama.cpp loads it; coli needs none.

Needs numpy and gguf-py (../shared/peers/gguf-py):
  python3 -m venv /tmp/venv-gg && /tmp/venv-gg/bin/pip install numpy pyyaml sentencepiece
  PYTHONPATH=../shared/peers/gguf-py /tmp/venv-gg/bin/python tools/make_gguf_mixers.py [name...]
The Qwen, Kimi and Mixtral files' tensor names come from gguf-py's map for the architecture, as the converter's do.
Deterministic: the same fixtures give the same bytes.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "gguf_mixers")


def read_safetensors(path):
    """The F32 (and integer) tensors of a safetensors file, by name (numpy only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": "<f4", "I64": "<i8", "I32": "<i4"}.get(info["dtype"])
        if dtype is None:
            raise SystemExit(f"{path}: {name} is {info['dtype']}, expected F32 (or an integer table)")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(info["shape"]).copy()
    return out


def load(name):
    d = os.path.join(FIXTURES, name)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(os.path.join(d, "model.safetensors"))


def vocab(gguf, w, n):
    """A minimal SentencePiece-style vocabulary of `n` tokens, for llama.cpp's loader."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(len(tokens), n)]
    tokens = tokens[:n]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (n - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n)])
    w.add_token_types(types[:n])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def common(w, cfg, name):
    """What the converter's base class writes for every text model."""
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf_mod.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        if "beta_fast" in rope:
            w.add_rope_scaling_yarn_beta_fast(float(rope["beta_fast"]))
        if "beta_slow" in rope:
            w.add_rope_scaling_yarn_beta_slow(float(rope["beta_slow"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf_mod.LlamaFileType.ALL_F32)


def deepseek2(cfg, t, file="deepseek2.gguf", fixture="deepseek_v3", softmax=False, arch="deepseek2", mtp=0):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, file), arch)
    # The converter counts the MTP blocks in `block_count` and writes them after the others.
    layers = cfg["num_hidden_layers"]
    cfg = dict(cfg, num_key_value_heads=1, num_hidden_layers=layers + mtp)
    common(w, cfg, f"{fixture} fixture")
    if mtp:
        w.add_nextn_predict_layers(mtp)
    h, nope, rope_dim, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kv_lora = cfg["kv_lora_rank"]
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    gating = gguf_mod.ExpertGatingFuncType
    w.add_expert_gating_func(gating.SOFTMAX if softmax else gating.SIGMOID)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + rope_dim)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(nope + rope_dim)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope_dim)
    rope = cfg.get("rope_parameters") or {}
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if arch in ("glm-dsa", "deepseek32"):
        w.add_indexer_head_count(cfg["index_n_heads"])
        w.add_indexer_key_length(cfg["index_head_dim"])
        w.add_indexer_top_k(cfg["index_topk"])
        if cfg.get("indexer_types") is not None:
            w.add_indexer_types([x == "full" for x in cfg["indexer_types"]])
    vocab(gguf_mod, w, cfg["vocab_size"])

    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        if i >= layers:
            # An MTP block: its own tensors under `nextn.` (embed_tokens and the head where the
            # checkpoint has them), then the layer's as the others'.
            for hf, gg in (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("embed_tokens", "embed_tokens"),
                           ("shared_head.norm", "shared_head_norm"), ("shared_head.head", "shared_head_head")):
                if p + hf + ".weight" in t:
                    w.add_tensor(b + "nextn." + gg + ".weight", t[p + hf + ".weight"])
        w.add_tensor(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        if cfg.get("q_lora_rank"):
            w.add_tensor(b + "attn_q_a.weight", t[p + "self_attn.q_a_proj.weight"])
            w.add_tensor(b + "attn_q_a_norm.weight", t[p + "self_attn.q_a_layernorm.weight"])
            w.add_tensor(b + "attn_q_b.weight", t[p + "self_attn.q_b_proj.weight"])
        else:
            w.add_tensor(b + "attn_q.weight", t[p + "self_attn.q_proj.weight"])
        w.add_tensor(b + "attn_kv_a_mqa.weight", t[p + "self_attn.kv_a_proj_with_mqa.weight"])
        w.add_tensor(b + "attn_kv_a_norm.weight", t[p + "self_attn.kv_a_layernorm.weight"])
        kv_b = t[p + "self_attn.kv_b_proj.weight"].reshape(h, nope + v, kv_lora)
        w.add_tensor(b + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)))
        w.add_tensor(b + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :]))
        w.add_tensor(b + "attn_output.weight", t[p + "self_attn.o_proj.weight"])
        ix = p + "self_attn.indexer."
        for hf, gg in (("wq_b.weight", "attn_q_b.weight"), ("wk.weight", "attn_k.weight"), ("k_norm.weight", "k_norm.weight"), ("k_norm.bias", "k_norm.bias"), ("weights_proj.weight", "proj.weight")):
            if ix + hf in t:
                w.add_tensor(b + "indexer." + gg, t[ix + hf])
        w.add_tensor(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        if i < cfg["first_k_dense_replace"]:
            for r in ("gate", "up", "down"):
                w.add_tensor(b + f"ffn_{r}.weight", t[p + f"mlp.{r}_proj.weight"])
            continue
        w.add_tensor(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
        if not softmax:
            w.add_tensor(b + "exp_probs_b.bias", t[p + "mlp.gate.e_score_correction_bias"])
        for r in ("down", "gate", "up"):
            stack = [t[p + f"mlp.experts.{e}.{r}_proj.weight"] for e in range(cfg["n_routed_experts"])]
            w.add_tensor(b + f"ffn_{r}_exps.weight", np.stack(stack))
        for r in ("gate", "up", "down"):
            w.add_tensor(b + f"ffn_{r}_shexp.weight", t[p + f"mlp.shared_experts.{r}_proj.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings"):
        w.add_tensor("output.weight", t["lm_head.weight"])
    return w


def gpt_oss(cfg, t):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, "gpt-oss.gguf"), "gpt-oss")
    common(w, cfg, "gpt_oss fixture")
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    vocab(gguf_mod, w, cfg["vocab_size"])

    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        for hf, gg in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
            w.add_tensor(b + f"attn_{gg}.weight", t[p + f"self_attn.{hf}_proj.weight"])
            w.add_tensor(b + f"attn_{gg}.bias", t[p + f"self_attn.{hf}_proj.bias"])
        w.add_tensor(b + "attn_sinks.weight", t[p + "self_attn.sinks"])
        w.add_tensor(b + "post_attention_norm.weight", t[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate_inp.weight", t[p + "mlp.router.weight"])
        w.add_tensor(b + "ffn_gate_inp.bias", t[p + "mlp.router.bias"])
        # [experts, hidden, 2 * ffn] input-major -> [experts, 2 * ffn, hidden], gate the even rows.
        gate_up = t[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)
        gate_up_bias = t[p + "mlp.experts.gate_up_proj_bias"]
        w.add_tensor(b + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, ::2, :]))
        w.add_tensor(b + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2, :]))
        w.add_tensor(b + "ffn_gate_exps.bias", np.ascontiguousarray(gate_up_bias[:, ::2]))
        w.add_tensor(b + "ffn_up_exps.bias", np.ascontiguousarray(gate_up_bias[:, 1::2]))
        down = t[p + "mlp.experts.down_proj"].transpose(0, 2, 1)
        w.add_tensor(b + "ffn_down_exps.weight", np.ascontiguousarray(down))
        w.add_tensor(b + "ffn_down_exps.bias", t[p + "mlp.experts.down_proj_bias"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    w.add_tensor("output.weight", t["lm_head.weight"])
    return w


MIMO2_MTP = 3


def mimo2(cfg, t):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, "mimo2.gguf"), "mimo2")
    n_layer = cfg["num_hidden_layers"]
    # The converter counts MiMo's 3 MTP blocks as layers (none in the fixture) and writes the
    # per-layer lists for them too, as sliding layers.
    hybrid = [int(x == "sliding_attention") for x in cfg["layer_types"]] + [1] * MIMO2_MTP
    kv = cfg["num_key_value_heads"]
    w.add_name("mimo_v2_flash fixture")
    w.add_block_count(n_layer + MIMO2_MTP)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([2 * kv if s else kv for s in hybrid])
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(float(rope["full_attention"]["rope_theta"]))
    w.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf_mod.ExpertGatingFuncType.SIGMOID)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["v_head_dim"])
    w.add_file_type(gguf_mod.LlamaFileType.ALL_F32)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_sliding_window_pattern(hybrid)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_rope_dimension_count(int(cfg["head_dim"] * rope["full_attention"]["partial_rotary_factor"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_attn_value_scale(float(cfg["attention_value_scale"]))
    w.add_nextn_predict_layers(MIMO2_MTP)
    vocab(gguf_mod, w, cfg["vocab_size"])

    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        for hf, gg in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
            w.add_tensor(b + f"attn_{gg}.weight", t[p + f"self_attn.{hf}_proj.weight"])
        if p + "self_attn.attention_sink_bias" in t:
            w.add_tensor(b + "attn_sinks.weight", t[p + "self_attn.attention_sink_bias"])
        w.add_tensor(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        if cfg["mlp_layer_types"][i] == "dense":
            for r in ("gate", "up", "down"):
                w.add_tensor(b + f"ffn_{r}.weight", t[p + f"mlp.{r}_proj.weight"])
            continue
        w.add_tensor(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
        w.add_tensor(b + "exp_probs_b.bias", t[p + "mlp.gate.e_score_correction_bias"])
        for r in ("down", "gate", "up"):
            stack = [t[p + f"mlp.experts.{e}.{r}_proj.weight"] for e in range(cfg["n_routed_experts"])]
            w.add_tensor(b + f"ffn_{r}_exps.weight", np.stack(stack))
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    w.add_tensor("output.weight", t["lm_head.weight"])
    return w


def zero_centred_plus_one(name):
    """Whether Qwen3-Next's converter stores this tensor plus 1: every `*norm.weight` but the
    Gated DeltaNet's output norm (llama.cpp's RMSNorm multiplies by the weight alone)."""
    return name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight")


def write_hf(path, tensors):
    """`tensors` as an F32 safetensors file (numpy only)."""
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def qwen3next_moe_for_dense(cfg, t):
    """Sparse-block weights for the fixture's dense layers (`mlp_only_layers`), which
    llama.cpp's qwen3next cannot hold (its converter maps no dense FFN, its loader wants
    experts in every layer). Seeded, scaled as the fixture's own sparse layers; also written
    as tests/fixtures/gguf_mixers/qwen3next-moe.safetensors, the reference's extra shard."""
    rng = np.random.default_rng(7)
    h, e, f, s = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    out = {}
    for i in cfg.get("mlp_only_layers") or []:
        p = f"model.layers.{i}.mlp."
        n = lambda *shape, std: (rng.standard_normal(shape) * std).astype(np.float32)
        out[p + "gate.weight"] = n(e, h, std=0.25)
        for x in range(e):
            out[p + f"experts.{x}.gate_proj.weight"] = n(f, h, std=0.38)
            out[p + f"experts.{x}.up_proj.weight"] = n(f, h, std=0.38)
            out[p + f"experts.{x}.down_proj.weight"] = n(h, f, std=0.12)
        out[p + "shared_expert.gate_proj.weight"] = n(s, h, std=0.12)
        out[p + "shared_expert.up_proj.weight"] = n(s, h, std=0.12)
        out[p + "shared_expert.down_proj.weight"] = n(h, s, std=0.12)
        out[p + "shared_expert_gate.weight"] = n(1, h, std=0.22)
    return out


def full_attention_interval(cfg):
    """The converter writes `full_attention_interval` (default 4); transformers 5 saves
    `layer_types` instead, so the interval is read back from them (and must be one)."""
    if "full_attention_interval" in cfg:
        return cfg["full_attention_interval"]
    full = [i for i, x in enumerate(cfg["layer_types"]) if x == "full_attention"]
    n = full[0] + 1
    if [i for i in range(cfg["num_hidden_layers"]) if (i + 1) % n == 0] != full:
        raise SystemExit(f"layer_types {cfg['layer_types']} are not every n-th layer full")
    return n


def tile(x, dim, nk, r, hd):
    """Value heads along `dim` from grouped by key head (kh * r + t) to tiled (t * nk + kh)."""
    shape = list(x.shape)
    y = x.reshape(shape[:dim] + [nk, r, hd] + shape[dim + 1:])
    return np.ascontiguousarray(np.swapaxes(y, dim, dim + 1)).reshape(shape)


def tile_value_heads(name, x, cfg):
    """Qwen3.5's converter re-lays every value-head dimension of a Gated DeltaNet from grouped
    to tiled order when there are more value than key heads (ggml's broadcast reads q and k
    head `h % key_heads`); `x` has had Qwen3-Next's transforms (squeezed convolution)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if nk == nv or "linear_attn." not in name:
        return x
    r, dk, dv = nv // nk, cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if ".in_proj_qkv." in name or ".conv1d." in name:
        qk = 2 * nk * dk
        return np.concatenate([x[:qk], tile(x[qk:], 0, nk, r, dv)], 0)
    if ".in_proj_z." in name:
        return tile(x, 0, nk, r, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name:
        return tile(x, 0, nk, r, 1)
    if ".A_log" in name or ".dt_bias" in name or ".dt_proj" in name:
        return tile(x[:, None], 0, nk, r, 1)[:, 0]
    if ".out_proj." in name:
        return tile(x, 1, nk, r, dv)
    return x


# Qwen3.5's MTP module's own tensors and their names in an MTP block (llama.cpp's `nextn.*`).
QWEN_NEXTN = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head_norm"}


def qwen3next(cfg, t, arch="qwen3next", file="qwen3next.gguf"):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, file), arch)
    t = dict(t)
    # An MTP module (`mtp.*`) is written as one more block after the others, counted in
    # `block_count`: its layer as `blk.L.*` (the same transforms), its own tensors as
    # `blk.L.nextn.*` (norms plus 1 as the others: llama.cpp's MTP graph multiplies by them alone).
    layers = cfg["num_hidden_layers"]
    mtp = 1 if any(k.startswith("mtp.") for k in t) else 0
    nextn = {}
    for k in [k for k in t if k.startswith("mtp.")]:
        x = t.pop(k)
        if k.startswith("mtp.layers.0."):
            t[f"model.layers.{layers}." + k[len("mtp.layers.0."):]] = x
        else:
            own = k[len("mtp."):-len(".weight")]
            nextn[f"blk.{layers}.nextn.{QWEN_NEXTN[own]}.weight"] = x + np.float32(1) if own != "fc" else x
    cfg = dict(cfg, num_hidden_layers=layers + mtp)
    names = gguf_mod.get_tensor_name_map(gguf_mod.MODEL_ARCH.QWEN3NEXT if arch == "qwen3next" else gguf_mod.MODEL_ARCH.QWEN35MOE, cfg["num_hidden_layers"])
    if arch == "qwen3next":
        extra = qwen3next_moe_for_dense(cfg, t)
        for i in cfg.get("mlp_only_layers") or []:
            for r in ("gate", "up", "down"):
                del t[f"model.layers.{i}.mlp.{r}_proj.weight"]
        t.update(extra)
        if extra:
            write_hf(os.path.join(OUT, "qwen3next-moe.safetensors"), extra)
    common(w, cfg, f"{arch} fixture")
    if mtp:
        w.add_nextn_predict_layers(mtp)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    w.add_full_attention_interval(full_attention_interval(cfg))
    # The rotary fraction as transformers reads it: `rope_parameters` first.
    partial = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    w.add_rope_dimension_count(int(cfg["head_dim"] * partial))
    if arch == "qwen35moe":
        sections = list(cfg["rope_parameters"]["mrope_section"]) + [0] * 4
        w.add_rope_dimension_sections(sections[:4])
    vocab(gguf_mod, w, cfg["vocab_size"])

    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, hidden = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["hidden_size"]
    experts = {}
    for name, x in t.items():
        if arch == "qwen35moe":
            x = tile_value_heads(name, x, cfg)
        if name.endswith(".A_log"):
            x = -np.exp(x)
        elif name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        elif "conv1d" in name:
            x = x.squeeze()
        elif zero_centred_plus_one(name):
            x = x + np.float32(1)
        if ".mlp.experts." in name:
            experts[name] = x
            continue
        if "in_proj_qkvz.weight" in name:
            # Per key head [q, k, v, z] -> every q, every k, every v (attn_qkv); every z (attn_gate).
            r = nv // nk
            g = x.T.reshape(hidden, nk, 2 * dk + 2 * r * dv)
            q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=-1)
            flat = lambda a: a.reshape(hidden, -1)
            b = name.split(".")[2]
            w.add_tensor(f"blk.{b}.attn_qkv.weight", np.ascontiguousarray(np.concatenate([flat(q), flat(k), flat(v)], -1).T))
            w.add_tensor(f"blk.{b}.attn_gate.weight", np.ascontiguousarray(flat(z).T))
            continue
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), x)
    for name, x in nextn.items():
        w.add_tensor(name, x)
    for i in range(cfg["num_hidden_layers"]):
        for r in ("down", "gate", "up"):
            stack = [experts.pop(f"model.layers.{i}.mlp.experts.{e}.{r}_proj.weight") for e in range(cfg["num_experts"])]
            w.add_tensor(f"blk.{i}.ffn_{r}_exps.weight", np.stack(stack))
    if experts:
        raise SystemExit(f"unmerged experts: {sorted(experts)[:3]}")
    return w


def kimi_linear(cfg, t):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, "kimi-linear.gguf"), "kimi-linear")
    names = gguf_mod.get_tensor_name_map(gguf_mod.MODEL_ARCH.KIMI_LINEAR, cfg["num_hidden_layers"])
    lin = cfg["linear_attn_config"]
    n_layer, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    nope, rope_dim, v, kv_lora = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    # What the base class writes, with num_key_value_heads set to 1 first (MLA as MQA), then
    # the keys Kimi's class writes over them (head_count_kv per layer, key_length).
    w.add_name("kimi_linear fixture")
    w.add_block_count(n_layer)
    w.add_context_length(cfg["model_max_length"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_token"])
    # `moe_router_activation_func` ("sigmoid" in Kimi-Linear's own configuration), which
    # transformers 5 does not save into the fixture's.
    w.add_expert_gating_func(gguf_mod.ExpertGatingFuncType.SIGMOID)
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf_mod.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_head_count_kv([1 if i + 1 in lin["full_attn_layers"] else 0 for i in range(n_layer)])
    w.add_ssm_conv_kernel(lin["short_conv_kernel_size"])
    w.add_kda_head_dim(lin["head_dim"])
    w.add_kv_lora_rank(kv_lora)
    w.add_rope_dimension_count(rope_dim)
    w.add_key_length(kv_lora + rope_dim)
    w.add_key_length_mla(nope + rope_dim)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["num_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
    vocab(gguf_mod, w, cfg["vocab_size"])

    experts = {}
    for name, x in t.items():
        b = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith((".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight")):
            x = x.reshape(1, x.shape[0], 1, x.shape[-1])
        if name.endswith(".A_log"):
            x = -np.exp(x)
        if name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        if name.endswith("kv_b_proj.weight"):
            kv_b = x.reshape(heads, nope + v, kv_lora)
            w.add_tensor(f"blk.{b}.attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)))
            w.add_tensor(f"blk.{b}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :]))
            continue
        if ".block_sparse_moe.experts." in name:
            experts[name] = x
            continue
        if name.endswith("e_score_correction_bias"):
            w.add_tensor(f"blk.{b}.exp_probs_b.bias", x)
            continue
        # transformers 5 saves the dense FFN under `block_sparse_moe.`; the remote code's name,
        # which the converter maps, is `mlp.`.
        for r in ("gate", "up", "down"):
            if name.endswith(f".block_sparse_moe.{r}_proj.weight"):
                name = f"model.layers.{b}.mlp.{r}_proj.weight"
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), x)
    for i in range(n_layer):
        if f"model.layers.{i}.block_sparse_moe.experts.0.w1.weight" not in experts:
            continue
        for r, hf in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            stack = [experts.pop(f"model.layers.{i}.block_sparse_moe.experts.{e}.{hf}.weight") for e in range(cfg["num_experts"])]
            w.add_tensor(f"blk.{i}.ffn_{r}_exps.weight", np.stack(stack))
    if experts:
        raise SystemExit(f"unmerged experts: {sorted(experts)[:3]}")
    return w


def llama_permute(x, heads):
    """llama.cpp's q/k row order for interleaved RoPE: per head, rows (j, j + hd/2) adjacent."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def mixtral(cfg, t):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, "mixtral.gguf"), "llama")
    common(w, cfg, "mixtral fixture")
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["head_dim"])
    vocab(gguf_mod, w, cfg["vocab_size"])
    names = gguf_mod.get_tensor_name_map(gguf_mod.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    experts = {}
    for name, x in t.items():
        if name.endswith("q_proj.weight"):
            x = llama_permute(x, cfg["num_attention_heads"])
        if name.endswith("k_proj.weight"):
            x = llama_permute(x, cfg["num_key_value_heads"])
        if ".block_sparse_moe.experts." in name:
            experts[name] = x
            continue
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), x)
    for i in range(cfg["num_hidden_layers"]):
        for r, hf in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            stack = [experts.pop(f"model.layers.{i}.block_sparse_moe.experts.{e}.{hf}.weight") for e in range(cfg["num_local_experts"])]
            w.add_tensor(f"blk.{i}.ffn_{r}_exps.weight", np.stack(stack))
    return w


# DeepSeek V4: the names transformers saves (below `model.`, as the original checkpoints' but
# `embed`, `norm`, `hc_head_*` and the KV norm) and llama.cpp's tensors for them.
DEEPSEEK4_TOP = {
    "model.embed_tokens.weight": "TOKEN_EMBD", "model.norm.weight": "OUTPUT_NORM", "head.weight": "OUTPUT",
    "model.hc_head.hc_fn": "HC_HEAD_FN", "model.hc_head.hc_base": "HC_HEAD_BASE", "model.hc_head.hc_scale": "HC_HEAD_SCALE",
}
DEEPSEEK4_LAYER = {
    "hc_attn_fn": "HC_ATTN_FN", "hc_attn_base": "HC_ATTN_BASE", "hc_attn_scale": "HC_ATTN_SCALE",
    "hc_ffn_fn": "HC_FFN_FN", "hc_ffn_base": "HC_FFN_BASE", "hc_ffn_scale": "HC_FFN_SCALE",
    "attn_norm.weight": "ATTN_NORM", "ffn_norm.weight": "FFN_NORM",
    "attn.attn_sink": "ATTN_SINKS", "attn.wq_a.weight": "ATTN_Q_A", "attn.q_norm.weight": "ATTN_Q_A_NORM",
    "attn.wq_b.weight": "ATTN_Q_B", "attn.wkv.weight": "ATTN_KV",
    # the original checkpoints' `attn.kv_norm`
    "attn.norm.weight": "ATTN_KV_NORM",
    "attn.wo_a.weight": "ATTN_OUT_A", "attn.wo_b.weight": "ATTN_OUT_B",
    "attn.compressor.wkv.weight": "ATTN_COMPRESSOR_WKV", "attn.compressor.wgate.weight": "ATTN_COMPRESSOR_WGATE",
    "attn.compressor.ape": "ATTN_COMPRESSOR_APE", "attn.compressor.norm.weight": "ATTN_COMPRESSOR_NORM",
    "attn.indexer.wq_b.weight": "INDEXER_ATTN_Q_B", "attn.indexer.weights_proj.weight": "INDEXER_PROJ",
    "attn.indexer.compressor.wkv.weight": "INDEXER_COMPRESSOR_WKV",
    "attn.indexer.compressor.wgate.weight": "INDEXER_COMPRESSOR_WGATE",
    "attn.indexer.compressor.ape": "INDEXER_COMPRESSOR_APE", "attn.indexer.compressor.norm.weight": "INDEXER_COMPRESSOR_NORM",
    "ffn.gate.weight": "FFN_GATE_INP", "ffn.gate.tid2eid": "FFN_GATE_TID2EID",
    "ffn.shared_experts.w1.weight": "FFN_GATE_SHEXP", "ffn.shared_experts.w3.weight": "FFN_UP_SHEXP",
    "ffn.shared_experts.w2.weight": "FFN_DOWN_SHEXP",
}


def deepseek4_original_config(cfg):
    """The original checkpoint's configuration keys the converter reads, from transformers'
    (which folds them into `layer_types`, `mlp_layer_types` and `rope_parameters` when it loads
    one): `compress_ratios` (per layer, then 0 for each MTP layer), `num_hash_layers`,
    `rope_scaling` (the compress parameters' YaRN, without the attention factor transformers
    forces to 1 and llama.cpp takes as 1)."""
    rates = dict(cfg["compress_rates"], sliding_attention=0)
    ratios = [rates[x] for x in cfg["layer_types"]] + [0] * cfg.get("num_nextn_predict_layers", 0)
    for x, r in zip(cfg["layer_types"], ratios):
        # The original format tells the kinds apart by the rate alone.
        if (x == "compressed_sparse_attention") != (r == 4):
            raise SystemExit(f"a {x} layer at rate {r}: the deepseek4 format cannot state it")
    hashed = cfg["mlp_layer_types"]
    n_hash = hashed.index("moe") if "moe" in hashed else len(hashed)
    if any(x != "moe" for x in hashed[n_hash:]):
        raise SystemExit(f"mlp_layer_types {hashed}: the hash layers are not the first ones")
    compress = cfg["rope_parameters"]["compress"]
    scaling = None
    if compress.get("rope_type") == "yarn":
        if compress.get("attention_factor", 1.0) != 1.0:
            raise SystemExit("a YaRN attention factor other than 1")
        scaling = {k: v for k, v in compress.items() if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}
    return ratios, n_hash, scaling


def deepseek4(cfg, t, file="deepseek4.gguf", fixture="deepseek_v4"):
    w = gguf_mod.GGUFWriter(os.path.join(OUT, file), "deepseek4")
    ratios, n_hash, scaling = deepseek4_original_config(cfg)
    layers = cfg["num_hidden_layers"]
    main = cfg["rope_parameters"]["main"]
    # The base class: the original's `rope_theta` and `rope_scaling`, `head_dim` as the key and
    # value length, `scoring_func` as the gating function.
    common(w, dict(cfg, rope_parameters=dict(scaling or {}, rope_theta=main["rope_theta"])), f"{fixture} fixture")
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_gating_func({"sqrtsoftplus": gguf_mod.ExpertGatingFuncType.SQRTSOFTPLUS,
                              "sigmoid": gguf_mod.ExpertGatingFuncType.SIGMOID,
                              "softmax": gguf_mod.ExpertGatingFuncType.SOFTMAX}[cfg["scoring_func"]])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    # DeepSeek V4's class.
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
    w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_attention_output_lora_rank(cfg["o_lora_rank"])
    w.add_attention_output_group_count(cfg["o_groups"])
    w.add_attention_compress_ratios(ratios)
    w.add_attention_compress_rope_freq_base(float(cfg["compress_rope_theta"]))
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
    w.add_hash_layer_count(min(n_hash, layers))
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_swiglu_clamp_exp([float(cfg["swiglu_limit"])] * layers)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_indexer_head_count(cfg["index_n_heads"])
    w.add_indexer_key_length(cfg["index_head_dim"])
    w.add_indexer_top_k(cfg["index_topk"])
    w.add_nextn_predict_layers(cfg["num_nextn_predict_layers"])
    w.add_hyper_connection_count(cfg["hc_mult"])
    w.add_hyper_connection_sinkhorn_iterations(cfg["hc_sinkhorn_iters"])
    w.add_hyper_connection_epsilon(float(cfg["hc_eps"]))
    vocab(gguf_mod, w, cfg["vocab_size"])

    name = lambda tensor, bid=None: gguf_mod.TENSOR_NAMES[getattr(gguf_mod.MODEL_TENSOR, tensor)].format(bid=bid)
    experts = {}
    for hf, x in t.items():
        if hf in DEEPSEEK4_TOP:
            w.add_tensor(name(DEEPSEEK4_TOP[hf]) + ".weight", x)
            continue
        parts = hf.split(".")
        bid, rest = int(parts[2]), ".".join(parts[3:])
        if rest.startswith("ffn.experts."):
            experts[hf] = x
        elif rest == "ffn.gate.bias":
            w.add_tensor(name("FFN_EXP_PROBS_B", bid) + ".bias", x)
        elif rest == "ffn.gate.tid2eid":
            w.add_tensor(name("FFN_GATE_TID2EID", bid) + ".weight", x.astype(np.int32))
        else:
            w.add_tensor(name(DEEPSEEK4_LAYER[rest], bid) + ".weight", x)
    for i in range(layers):
        for tensor, hf in (("FFN_GATE_EXP", "w1"), ("FFN_UP_EXP", "w3"), ("FFN_DOWN_EXP", "w2")):
            stack = [experts.pop(f"model.layers.{i}.ffn.experts.{e}.{hf}.weight") for e in range(cfg["n_routed_experts"])]
            w.add_tensor(name(tensor, i) + ".weight", np.stack(stack))
    if experts:
        raise SystemExit(f"unmerged experts: {sorted(experts)[:3]}")
    return w


def deepseek2_softmax(cfg, t):
    return deepseek2(cfg, t, "deepseek2-v2.gguf", "deepseek_v2", softmax=True)


MAKERS = {
    "deepseek_v3": deepseek2, "deepseek_v2": deepseek2_softmax, "gpt_oss": gpt_oss, "mimo_v2_flash": mimo2,
    "qwen3_next": qwen3next,
    "qwen3_5_moe": lambda cfg, t: qwen3next(cfg, t, "qwen35moe", "qwen35moe.gguf"),
    "qwen3_5_moe_mtp": lambda cfg, t: qwen3next(cfg, t, "qwen35moe", "qwen35moe-mtp.gguf"),
    "kimi_linear": kimi_linear,
    "mixtral": mixtral,
    "glm_moe_dsa": lambda cfg, t: deepseek2(cfg, t, "glm-dsa.gguf", "glm_moe_dsa", arch="glm-dsa"),
    "glm_moe_dsa_mtp": lambda cfg, t: deepseek2(cfg, t, "glm-dsa-mtp.gguf", "glm_moe_dsa_mtp", arch="glm-dsa", mtp=1),
    "deepseek_v32": lambda cfg, t: deepseek2(cfg, t, "deepseek32.gguf", "deepseek_v32", arch="deepseek32"),
    "deepseek_v32_mtp": lambda cfg, t: deepseek2(cfg, t, "deepseek32-mtp.gguf", "deepseek_v32_mtp", arch="deepseek32", mtp=1),
    "deepseek_v4": deepseek4,
    "deepseek_v4_csa4": lambda cfg, t: deepseek4(cfg, t, "deepseek4-compressed.gguf", "deepseek_v4_csa4"),
}


def main():
    global gguf_mod
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=list(MAKERS), help=f"fixtures to convert ({', '.join(MAKERS)})")
    args = ap.parse_args()
    import gguf

    gguf_mod = gguf
    os.makedirs(OUT, exist_ok=True)
    for name in args.names:
        if name not in MAKERS:
            raise SystemExit(f"unknown fixture {name!r} (known: {', '.join(MAKERS)})")
        cfg, tensors = load(name)
        w = MAKERS[name](cfg, tensors)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"{name}: {w.path if hasattr(w, 'path') else ''}", file=sys.stderr)


gguf_mod = None

if __name__ == "__main__":
    main()
