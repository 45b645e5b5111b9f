"""The LoRA write-up's tables (lab/results/lora.md), rebuilt from its committed records alone:
the learning rates tried on validation worlds, LoRA against full fine-tuning in held-out macro EM
paired by seed, the CPU's peak memory of one EviSD update with and without an adapter, and the
peaks the formula fitted to those and to the H200's figures predicts for 0.5B to 7B.

    python lab/results/lora_tables.py                      # the tables from lora-records.json
    python lab/results/lora_tables.py --collect out/lora-exp   # the records from protocol-lora.sh
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from lab.gpu_memory import COMMON_SHAPE, SHAPES  # noqa: E402

RECORDS = os.path.join(HERE, "lora-records.json")
H200 = os.path.join(HERE, "gpu-check-h200.json")
GB = 1e9
RANK = 16
# Bytes per parameter during a GPU update under bf16 autocast. Full fine-tuning: float32
# weights, gradients and AdamW's two moments (16), the float32 reference (4), autocast's bf16
# copies (2). LoRA: the frozen base in bf16 (2), no reference copy (the adapter is switched off);
# each adapter parameter costs what a fully trained one does, less the reference (18).
FULL_BYTES, BASE_BYTES, ADAPTER_BYTES = 22, 2, 18
# The H200's peaks (2026-12-04) were measured with a bf16 reference: 20 bytes per parameter.
H200_BYTES = 20
WORST = (40, 2570)           # the Qwen preset's worst case: episodes x tokens (docs/one-gpu.md)


def shape_counts(shape):
    """(parameters, LoRA rank-16 parameters, hidden x layers) of a Qwen2.5 shape, on no memory."""
    s = SHAPES[shape]
    with torch.device("meta"):
        lm = Qwen2ForCausalLM(Qwen2Config(**s, **COMMON_SHAPE))
    h, m = s["hidden_size"], s["intermediate_size"]
    kv = s["num_key_value_heads"] * h // s["num_attention_heads"]
    # rank x (in + out) on q, k, v, o, gate, up and down: 9h + 2kv + 3m per layer
    adapter = RANK * (9 * h + 2 * kv + 3 * m) * s["num_hidden_layers"]
    return sum(p.numel() for p in lm.parameters()), adapter, h * s["num_hidden_layers"]


def fit_line(xs, ys):
    """(intercept, slope) of the least-squares line through the points."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
             / sum((x - mx) ** 2 for x in xs))
    return my - slope * mx, slope


def validation_table(records):
    rows = ["| LR | of full fine-tuning's | validation macro EM, seed 0 (3 worlds) |",
            "|---|---|---|"]
    chosen = records["chosen_lr"]
    for lr, macro in sorted(records["validation_macro"].items(), key=lambda kv: float(kv[0])):
        mark = " (chosen)" if float(lr) == chosen else ""
        rows.append(f"| {float(lr):g}{mark} | {float(lr) / 2e-4:g}x | {macro:.3f} |")
    return rows


def paired_table(records):
    runs = {(r["group"], r["seed"]): r for r in records["heldout"]["runs"]}
    rows = ["| seed | warm-up | full fine-tuning | LoRA r16 | LoRA − full |",
            "|---|---|---|---|---|"]
    for seed in sorted({s for _, s in runs}):
        full, lora = runs[("full", seed)], runs[("lora", seed)]
        rows.append(f"| {seed} | {full['warmup_macro']:.3f} | {full['macro']:.3f} | "
                    f"{lora['macro']:.3f} | {lora['macro'] - full['macro']:+.3f} |")
    mean, low, high = records["heldout"]["paired"]["lora"]["macro"]
    rows.append(f"| mean [95%] | | | | {mean:+.3f} [{low:+.3f}, {high:+.3f}] |")
    return rows


def cpu_table(records):
    """The CPU probes, and the bytes per parameter their peaks grow by (a line per method)."""
    probes = records["cpu_probes"]
    rows = ["| shape | layers | parameters | full fine-tuning + reference | LoRA r16 "
            "| LoRA / full |", "|---|---|---|---|---|---|"]
    by = {(p["shape"], p["layers"], p["lora_rank"]): p for p in probes}
    # each size once, smallest first
    sizes = sorted({(shape, layers) for shape, layers, _ in by},
                   key=lambda size: by[(*size, 0)]["params"])
    for shape, layers in sizes:
        full, lora = by[(shape, layers, 0)], by[(shape, layers, RANK)]
        rows.append(f"| {shape} | {layers} | {full['params'] / 1e9:.3f}B | "
                    f"{full['peak_rss_gb']:.2f} GB | {lora['peak_rss_gb']:.2f} GB | "
                    f"{lora['peak_rss_gb'] / full['peak_rss_gb']:.2f} |")
    slopes = {}
    for rank in (0, RANK):
        points = [(by[(s, l, 0)]["params"], by[(s, l, rank)]["peak_rss_gb"] * GB) for s, l in sizes]
        slopes[rank] = fit_line(*zip(*points))
    rows.append("")
    rows.append(f"Fitted, peak = c + k · parameters: full fine-tuning c = "
                f"{slopes[0][0] / GB:.2f} GB, k = {slopes[0][1]:.1f} bytes (expected 20: float32 "
                f"weights, gradients, AdamW, reference); LoRA c = {slopes[RANK][0] / GB:.2f} GB, "
                f"k = {slopes[RANK][1]:.1f} bytes (expected 4: the float32 base alone).")
    return rows, slopes


def activation_fit():
    """(a, b): the H200's peaks less their weights' bytes, as a + b · hidden · layers (GB)."""
    figures = json.load(open(H200))["parts"]["memory"]["figures"]
    points = []
    for shape in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        f = figures[f"{shape}, with checkpointing"]
        points.append((shape_counts(shape)[2], f["peak_gb"] - H200_BYTES * f["params"] / GB))
    return fit_line(*zip(*points))


def prediction_table():
    a, b = activation_fit()
    rows = ["| model | parameters | LoRA r16 parameters | activations (fitted) | full fine-tuning "
            "| LoRA r16 | LoRA / full |", "|---|---|---|---|---|---|---|"]
    # The 7B preset's 32 episodes too: the line's slope scales with the episodes, its intercept
    # (the head's logit chunks and the like) does not.
    cases = [(shape, shape, WORST[0]) for shape in SHAPES if shape != "tiny"]
    cases.append(("qwen2.5-7b, its preset's 32 episodes", "qwen2.5-7b", 32))
    for name, shape, episodes in cases:
        params, adapter, hl = shape_counts(shape)
        act = a + b * hl * episodes / WORST[0]
        full = FULL_BYTES * params / GB + act
        lora = (BASE_BYTES * params + ADAPTER_BYTES * adapter) / GB + act
        rows.append(f"| {name} | {params / 1e9:.2f}B | {adapter / 1e6:.1f}M | {act:.1f} GB | "
                    f"{full:.1f} GB | {lora:.1f} GB | {lora / full:.2f} |")
    rows.append("")
    rows.append(f"Activations at the worst case ({WORST[0]} episodes x {WORST[1]} tokens, "
                f"checkpointing): {a:.2f} + {b * 1e3:.3f} · hidden · layers / 1000 GB, the line "
                f"through the H200's two peaks less {H200_BYTES} bytes per parameter.")
    return rows


def collect(exp):
    """lora-records.json from protocol-lora.sh's directory: what the tables need, no more."""
    chosen = json.load(open(os.path.join(exp, "chosen-lr.json")))
    probes = []
    for name in sorted(os.listdir(os.path.join(exp, "mem"))):
        if name.endswith(".json"):
            shape = name[:-5].rsplit("-", 2)[0]      # qwen2.5-0.5b-l8-r16.json
            probes.append(dict(json.load(open(os.path.join(exp, "mem", name))), shape=shape))
    records = {"validation_macro": chosen["validation_macro"], "chosen_lr": chosen["chosen"],
               "heldout": json.load(open(os.path.join(exp, "heldout.json"))),
               "cpu_probes": probes}
    with open(RECORDS, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {RECORDS}")


def main():
    if sys.argv[1:2] == ["--collect"]:
        return collect(sys.argv[2])
    records = json.load(open(RECORDS))
    print("## Learning rate, chosen on validation worlds\n")
    print("\n".join(validation_table(records)))
    print("\n## Held-out macro EM, paired by seed\n")
    print("\n".join(paired_table(records)))
    print("\n## One EviSD update on the CPU: peak resident memory\n")
    print("\n".join(cpu_table(records)[0]))
    print("\n## Predicted peaks on one GPU, bf16 autocast, the worst case\n")
    print("\n".join(prediction_table()))


if __name__ == "__main__":
    main()
