"""Writes a random-weight Hugging Face checkpoint of a named geometry, for benchmarks.

Run where torch and transformers are (the GPU machine has both):

    python3 tools/make_random_checkpoint.py smollm2-135m /tmp/smollm2-random
    python3 tools/make_random_checkpoint.py olmoe-1b-7b /tmp/olmoe-1b-7b

Weights are bf16, normal with std 0.02 (what the architectures' initializers draw); speed does
not depend on their values. The geometries are the published models'.
"""
import sys

import torch
import transformers as tf

GEOMETRIES = {
    "smollm2-135m": lambda: tf.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    # The same with a 40K-token position limit (the KV split's 32K-context benchmark).
    "smollm2-135m-long": lambda: tf.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=40960,
        rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "olmoe-1b-7b": lambda: tf.OlmoeConfig(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
        max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-5),
    # gpt-oss-20b: alternating sliding (128) and full attention with sinks, 32 experts top-4.
    "gpt-oss-20b": lambda: tf.GptOssConfig(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
        layer_types=["sliding_attention", "full_attention"] * 12, tie_word_embeddings=False),
    # Kimi-Linear-48B-A3B at full width, cut to 8 layers (the published 27 do not fit the GPU
    # machine's disk as bf16): KDA, KDA, KDA, MLA, KDA, KDA, KDA, MLA as the published pattern
    # starts (a full layer every fourth), the first layer dense, 256 experts top-8 + 1 shared.
    "kimi-linear-48b-a3b-8l": lambda: tf.KimiLinearConfig(
        vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
        num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=32, q_lora_rank=None,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        linear_attn_config={"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7], "head_dim": 128,
                            "num_heads": 32, "short_conv_kernel_size": 4},
        num_experts=256, num_experts_per_tok=8, n_shared_experts=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.446, first_k_dense_replace=1,
        max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # Qwen3.5-35B-A3B at full width, cut to 8 layers (Gated DeltaNet x3, gated attention, twice:
    # the published pattern's first eight), 256 experts top-8 + a gated shared expert.
    "qwen3.5-35b-a3b-8l": lambda: tf.Qwen3_5MoeTextConfig(
        vocab_size=248320, hidden_size=2048, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}),
    # GLM-5 (GlmMoeDsaConfig's defaults are GLM-5's) at full width, cut to 5 layers (the
    # published 78 start with 3 dense ones; 5 is what the GPU machine's 64 GiB disk holds as bf16):
    # MLA with the DSA indexer (32 heads of 128, top 2048) in every layer, 256 experts of 2,048
    # top-8 + 1 shared from the fourth layer.
    "glm-5-5l": lambda: tf.GlmMoeDsaConfig(
        num_hidden_layers=5, mlp_layer_types=["dense"] * 3 + ["sparse"] * 2,
        layer_types=["deepseek_sparse_attention"] * 5, indexer_types=["full"] * 5,
        max_position_embeddings=16384),
    # The same cut to its first 2 (dense) layers: the attention's kernels per layer at GLM-5's
    # width, made and loaded in seconds.
    "glm-5-2l": lambda: tf.GlmMoeDsaConfig(
        num_hidden_layers=2, mlp_layer_types=["dense"] * 2,
        layer_types=["deepseek_sparse_attention"] * 2, indexer_types=["full"] * 2,
        max_position_embeddings=16384),
    # DeepSeek V4-Flash (DeepseekV4Config's defaults are V4-Flash's: hidden 4096, 4 residual
    # streams, 64 heads of 512 with one KV head, 256 experts of 2,048 top-6 + 1 shared) at full
    # width, cut to 3 layers (what the GPU machine's disk holds as bf16), one of each kind in the
    # published 43: heavily compressed attention with hash routing (as layers 0-2), compressed
    # sparse attention (its indexer) and heavily compressed attention with scored routing.
    "deepseek-v4-flash-3l": lambda: tf.DeepseekV4Config(
        num_hidden_layers=3, max_position_embeddings=16384,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"]),
    # The same cut to its compressed sparse attention layer alone (the lightning indexer over the
    # compressor's entries), with scored routing.
    "deepseek-v4-flash-1l": lambda: tf.DeepseekV4Config(
        num_hidden_layers=1, max_position_embeddings=16384,
        layer_types=["compressed_sparse_attention"], mlp_layer_types=["moe"]),
}


def main():
    name, out = sys.argv[1], sys.argv[2]
    cfg = GEOMETRIES[name]()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters -> {out}")


if __name__ == "__main__":
    main()
