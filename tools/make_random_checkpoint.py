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
