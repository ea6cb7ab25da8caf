#!/usr/bin/env python3
"""Checks coli against transformers on checkpoints it has never seen: every tiny fixture family
of make_fixtures.py again with other dimensions and another seed (the VARIANTS below), written
to a scratch directory (never into tests/fixtures/), then run by the `coli` binary on the CPU
(the whole prompt, and in chunks of 1 and 3) and on the Vulkan device, each run compared with
the transformers oracle of the same files.

The committed fixtures pin the shapes the tests were written against; this sweep is how a shape
the engine silently assumes (a head width equal to hidden / heads, a group count of one, a
layer pattern) is found before a user's checkpoint finds it.

Usage (from the repository root; needs torch, transformers 5.17, safetensors, and a release
build of coli: `cargo build --release`):

    ~/.venvs/oracle/bin/python tools/sweep_fixtures.py                 # every family
    ~/.venvs/oracle/bin/python tools/sweep_fixtures.py olmoe kimi_linear
    ~/.venvs/oracle/bin/python tools/sweep_fixtures.py --modes cpu,vulkan --out /tmp/sweep

Prints one line per family and mode: the largest deviation from the oracle over the prompt's
logits and the greedy steps' logits, relative to the largest |logit|, and whether the greedy ids
are the oracle's. Exits non-zero when any run misses the bound the tests use (1e-4 of the
largest |logit|, greedy ids identical) or fails.
"""

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_fixtures  # noqa: E402 (beside this script)

BOUND = 1e-4

# Variant "a" per family: a seed offset and the configuration keys that differ from the
# committed fixture, mostly widths and counts. Each variant keeps the family's own constraints
# (heads dividing widths, group counts dividing expert counts, one layer type per layer) and
# changes what a hidden assumption would hang on.
VARIANTS_A = {
    "llama": (101, dict(hidden_size=80, intermediate_size=144, num_hidden_layers=2, num_attention_heads=5,
                        num_key_value_heads=1, head_dim=24, vocab_size=300, rms_norm_eps=1e-6,
                        rope_parameters=make_fixtures.rope(500000.0))),
    "llama_tied": (102, dict(hidden_size=48, intermediate_size=120, num_hidden_layers=3, num_attention_heads=6,
                             num_key_value_heads=3, head_dim=8, vocab_size=280)),
    "olmoe": (103, dict(hidden_size=96, intermediate_size=40, num_hidden_layers=3, num_attention_heads=6,
                        num_key_value_heads=3, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True,
                        vocab_size=400)),
    "qwen3_moe": (104, dict(hidden_size=48, intermediate_size=64, moe_intermediate_size=36, num_hidden_layers=3,
                            num_attention_heads=3, num_key_value_heads=1, head_dim=24, num_experts=10,
                            num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[1], vocab_size=360)),
    "mixtral": (105, dict(hidden_size=96, intermediate_size=72, num_hidden_layers=3, num_attention_heads=6,
                          num_key_value_heads=2, head_dim=16, num_local_experts=5, num_experts_per_tok=3,
                          vocab_size=272)),
    "gpt_oss": (106, dict(hidden_size=80, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=1, head_dim=20, num_local_experts=8, num_experts_per_tok=3,
                          sliding_window=5,
                          layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])),
    "deepseek_v3": (107, dict(hidden_size=80, intermediate_size=112, moe_intermediate_size=20, num_hidden_layers=4,
                              num_attention_heads=5, num_key_value_heads=5, q_lora_rank=40, kv_lora_rank=24,
                              qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=20, n_routed_experts=12,
                              n_shared_experts=2, num_experts_per_tok=3, n_group=3, topk_group=2,
                              routed_scaling_factor=1.7, first_k_dense_replace=2,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 2.0,
                                               "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "mscale": 0.8, "mscale_all_dim": 1.0})),
    "deepseek_v2": (108, dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_attention_heads=4,
                              num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                              qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
                              num_experts_per_tok=2, n_group=1, topk_group=1, topk_method="greedy",
                              routed_scaling_factor=1.0)),
    "qwen3_next": (109, dict(hidden_size=80, intermediate_size=112, moe_intermediate_size=24,
                             shared_expert_intermediate_size=40,
                             layer_types=["full_attention", "linear_attention", "linear_attention", "linear_attention"],
                             num_attention_heads=5, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.5,
                             rope_parameters={"rope_type": "default", "rope_theta": 100000.0,
                                              "partial_rotary_factor": 0.5},
                             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=8,
                             linear_value_head_dim=10, num_experts=6, num_experts_per_tok=3, mlp_only_layers=[])),
    "qwen3_5_moe": (110, dict(hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=4,
                              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                              num_experts=8, num_experts_per_tok=3)),
    "kimi_linear": (111, dict(hidden_size=64, intermediate_size=80, moe_intermediate_size=16, num_attention_heads=4,
                              num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                              v_head_dim=16,
                              linear_attn_config={"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 16,
                                                  "num_heads": 4, "short_conv_kernel_size": 3},
                              num_experts=8, num_experts_per_tok=3, routed_scaling_factor=1.0)),
    "mimo_v2_flash": (112, dict(hidden_size=80, intermediate_size=112, moe_intermediate_size=20,
                                num_attention_heads=6, head_dim=16, v_head_dim=24, sliding_window=6,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                             "sliding_attention"],
                                mlp_layer_types=["sparse", "dense", "sparse", "sparse"],
                                n_routed_experts=8, num_experts_per_tok=3)),
    "inkling": (113, dict(hidden_size=60, intermediate_size=72, moe_intermediate_size=24, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=20, swa_num_attention_heads=6, swa_num_key_value_heads=3,
                          swa_head_dim=10, sliding_window_size=5, d_rel=4, rel_extent=8,
                          layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
                          conv_kernel_size=3, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1)),
    "deepseek_v32": (114, dict(hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_attention_heads=3,
                               num_key_value_heads=3, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=12,
                               qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=6, n_group=2, topk_group=1,
                               index_n_heads=4, index_head_dim=32, index_topk=7)),
    "glm_moe_dsa": (115, dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
                              q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                              v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
                              mlp_layer_types=["dense", "sparse", "dense", "sparse"],
                              indexer_types=["full", "full", "shared", "full"], index_n_heads=4,
                              index_head_dim=16, index_topk=4)),
    "deepseek_v4": (116, dict(hidden_size=48, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=6,
                              head_dim=16, q_lora_rank=24, partial_rotary_factor=0.5, hc_mult=3, hc_sinkhorn_iters=7,
                              o_groups=3, o_lora_rank=8, n_routed_experts=6, num_experts_per_tok=3,
                              layer_types=["sliding_attention"] * 3, mlp_layer_types=["hash_moe", "moe", "moe"],
                              sliding_window=5, scoring_func="sigmoid")),
    "deepseek_v4_compressed": (117, dict(compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 3},
                                         index_topk=4, sliding_window=3, hc_mult=2, index_n_heads=6, index_head_dim=12)),
}

# Variant "b": options the committed fixtures leave at one value (biases, tied heads, layer
# patterns, the LoRA or not, longer prompts past windows and top-k cuts), as
# (seed offset, configuration keys, fixture keys such as the prompt's length).
VARIANTS_B = {
    "llama": (201, dict(attention_bias=True, mlp_bias=True, num_key_value_heads=4), {}),
    "olmoe": (203, dict(tie_word_embeddings=True, norm_topk_prob=True), {}),
    "qwen3_moe": (204, dict(decoder_sparse_step=2, num_hidden_layers=4, tie_word_embeddings=True), {}),
    "mixtral": (205, dict(sliding_window=6), {"prompt_len": 24}),
    "gpt_oss": (206, dict(sliding_window=3), {"prompt_len": 24}),
    "deepseek_v3": (207, dict(q_lora_rank=None, rope_interleave=False, norm_topk_prob=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), {}),
    "qwen3_next": (209, dict(decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=True), {"prompt_len": 24}),
    "qwen3_5_moe": (210, dict(tie_word_embeddings=True), {"prompt_len": 24}),
    "kimi_linear": (211, dict(q_lora_rank=24, first_k_dense_replace=0), {"prompt_len": 24}),
    "mimo_v2_flash": (212, dict(v_head_dim=32, sliding_window=3), {"prompt_len": 24}),
    "inkling": (213, dict(sliding_window_size=3, rel_extent=3), {"prompt_len": 24}),
    "deepseek_v32": (214, dict(index_topk=9), {"prompt_len": 30}),
    "glm_moe_dsa": (215, dict(index_topk=3), {"prompt_len": 30}),
    "deepseek_v4": (216, dict(scoring_func="sqrtsoftplus", mlp_layer_types=["moe"] * 4, hc_mult=2, sliding_window=3,
                              swiglu_limit=10.0), {"prompt_len": 24}),
    # Without `layer_types`: transformers' schedule (two heavily compressed layers, then both kinds in turn).
    "deepseek_v4_compressed": (217, dict(layer_types=None, num_hidden_layers=5, mlp_layer_types=["hash_moe"] + ["moe"] * 4,
                                         compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 6},
                                         index_topk=2), {"prompt_len": 30}),
}

# Variant "c": `attention_bias` where the family's configuration has it.
VARIANTS_C = {
    n: (300 + i, dict(attention_bias=True), {})
    for i, n in enumerate(["olmoe", "qwen3_moe", "deepseek_v3", "deepseek_v2", "qwen3_next", "qwen3_5_moe",
                           "mimo_v2_flash", "kimi_linear", "deepseek_v32", "glm_moe_dsa"])
}

# Variant "y": RoPE scaling where a family reads it per layer type, sliding windows, options on by default
# turned off.
VARIANTS_Y = {
    "gpt_oss": (402, dict(attention_bias=False), {}),
    "qwen3_moe": (401, dict(use_sliding_window=True, sliding_window=5), {"prompt_len": 24}),
    "mimo_v2_flash": (400, dict(rope_parameters={
        "full_attention": {"rope_type": "yarn", "rope_theta": 5000000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                           "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.334},
    }), {"prompt_len": 24}),
}

VARIANTS = {
    **{f"{n}": (n, o, c, {}) for n, (o, c) in VARIANTS_A.items()},
    **{f"{n}-y": (n, o, c, x) for n, (o, c, x) in VARIANTS_Y.items()},
    **{f"{n}-b": (n, o, c, x) for n, (o, c, x) in VARIANTS_B.items()},
    **{f"{n}-c": (n, o, c, x) for n, (o, c, x) in VARIANTS_C.items()},
}

MODES = {
    "cpu": ["--device", "cpu"],
    "cpu-chunk1": ["--device", "cpu", "--chunk", "1"],
    "cpu-chunk3": ["--device", "cpu", "--chunk", "3"],
    "vulkan": ["--device", "vulkan"],
}


def variant_spec(variant):
    """The family's fixture entry with the variant's configuration and seed."""
    family, offset, overrides, extra = VARIANTS[variant]
    spec = copy.deepcopy({k: v for k, v in make_fixtures.TINY[family].items() if not callable(v)})
    for k, v in make_fixtures.TINY[family].items():
        if callable(v):
            spec[k] = v  # hooks (post_init, probe, router_gap, accept) stay the family's
    spec["config"].update(copy.deepcopy(overrides))
    spec.update(extra)
    spec["seed"] = spec["seed"] + 100 * offset
    spec["note"] = f"sweep variant {variant}: {sorted(overrides)}"
    spec["check_names"] = False  # the committed fixtures' name lists assume their layer patterns
    return spec


def run_coli(coli, model_dir, oracle, mode, out):
    ids = ",".join(str(i) for i in oracle["prompt_ids"])
    cmd = [str(coli), "exec", "-q", "-m", str(model_dir), "--prompt-ids", ids, "-n", str(len(oracle["greedy"])),
           "--temperature", "0", "--exact", "--ignore-eos", "--logits-out", str(out)] + MODES[mode]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["(no message)"])[-1]
    return json.loads(out.read_text()), None


def compare(oracle, got):
    """The largest deviation over the prompt's rows and the greedy steps' rows (the row each
    greedy id was chosen from), over the largest |logit|; and whether the greedy ids agree."""
    want = list(oracle["logits"]) + list(oracle["greedy_logits"][1:])
    rows = got["logits"]
    n = min(len(want), len(rows))
    worst = 0.0
    for w, g in zip(want[:n], rows[:n]):
        worst = max(worst, max(abs(a - b) for a, b in zip(w, g)))
    same = list(got["generated"]) == list(oracle["greedy"])
    return worst / float(oracle["max_abs_logit"]), same, n == len(want)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="variants: a family's name (variant a) or name-b (default: all)")
    ap.add_argument("--out", default="/tmp/coli-sweep", help="scratch directory for the checkpoints")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--coli", default=str(ROOT / "target" / "release" / "coli"))
    ap.add_argument("--reuse", action="store_true", help="keep checkpoints already written under --out")
    args = ap.parse_args()
    names = args.names or list(VARIANTS)
    modes = [m for m in args.modes.split(",") if m]
    failed = []
    for name in names:
        out_dir = Path(args.out) / name
        if not (args.reuse and (out_dir / "oracle.json").exists()):
            try:
                make_fixtures.make_tiny(VARIANTS[name][0], spec=variant_spec(name), out_dir=out_dir)
            except (Exception, SystemExit) as e:  # a variant transformers refuses, or no good seed
                print(f"FAIL {name:16} {'make':11} the variant could not be made: {e!r}")
                failed.append((name, "make"))
                continue
        oracle = json.loads((out_dir / "oracle.json").read_text())
        for mode in modes:
            got, err = run_coli(args.coli, out_dir, oracle, mode, out_dir / f"coli-{mode}.json")
            if err is not None:
                print(f"FAIL {name:16} {mode:11} error: {err}")
                failed.append((name, mode))
                continue
            dev, same, whole = compare(oracle, got)
            ok = dev <= BOUND and same and whole
            print(f"{'ok  ' if ok else 'FAIL'} {name:16} {mode:11} max dev {dev:.2e} of max|logit|, "
                  f"greedy {'equal' if same else 'DIFFERENT'}{'' if whole else ', rows missing'}")
            if not ok:
                failed.append((name, mode))
    print(f"{len(failed)} failed" + (": " + ", ".join(f"{n}/{m}" for n, m in failed) if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
