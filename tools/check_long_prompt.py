#!/usr/bin/env python3
"""A long prompt through a real trained model, coli against transformers: pymoe-22m (trained
OLMoE, ../shared/models/pymoe-22m) on the first N tokens of a Python source file, so that the
prompt crosses coli's 512-row chunks and RoPE runs at positions the fixtures never reach; every
prompt position's logits and 16 greedy steps compared, on each device named.

Usage (the oracle environment; a release build of coli):

    ~/.venvs/oracle/bin/python tools/check_long_prompt.py 1400 cpu vulkan

Prints, per device, the largest deviation over the prompt's logits relative to the largest
|logit| and whether the greedy ids are transformers'. 2026-12-03: 1,400 tokens, CPU 9.4e-7
(default precision and --exact alike: bf16 weights), Lavapipe 7.8e-7, greedy equal on both.
"""
import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT.parent / "shared" / "models" / "pymoe-22m"


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1400
    devices = sys.argv[2:] or ["cpu"]
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(MODEL)
    import transformers.generation.utils as source

    ids = tok(Path(source.__file__).read_text())["input_ids"][:n]
    m = AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = m(input_ids=torch.tensor([ids]), use_cache=True)
        want, past, row = out.logits[0].float(), out.past_key_values, out.logits[0, -1]
        greedy = []
        for _ in range(16):
            greedy.append(int(row.argmax()))
            o = m(input_ids=torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True)
            past, row = o.past_key_values, o.logits[0, -1]
    top = float(want.abs().max())
    bad = 0
    for dev in devices:
        out_json = Path("/tmp") / f"coli-long-{dev}.json"
        cmd = [str(ROOT / "target" / "release" / "coli"), "exec", "-q", "-m", str(MODEL), "--prompt-ids",
               ",".join(map(str, ids)), "-n", "16", "--temperature", "0", "--ignore-eos", "--logits-out",
               str(out_json), "--device", dev]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(f"{dev}: error: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        g = json.loads(out_json.read_text())
        dev_max = float((torch.tensor(g["logits"][: len(ids)]) - want).abs().max()) / top
        same = g["generated"] == greedy
        print(f"{dev}: {len(ids)} tokens, max dev {dev_max:.2e} of max|logit| {top:.2f}, greedy {'equal' if same else 'DIFFERENT'}")
        bad += int(dev_max > 1e-4 or not same)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
