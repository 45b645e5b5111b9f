"""Warm-up recipes across seeds: for each seed, the warm-up (cached like train.py's), its loss
curve and wall time, and its greedy EM per hop on *validation* worlds, where a recipe may be
chosen (never on the held-out ones).

    python lab/warmup_sweep.py baseline --seeds 0-9
    # train.py overrides
    python lab/warmup_sweep.py lr6e-3 --seeds 1,2,7 --SFT_STEPS=500 --SFT_LR=6e-3
    # the tiny model's shape
    python lab/warmup_sweep.py mha --seeds 1,2 --shape 128,4,4,4,384
    # QK-norm; zero-init projections
    python lab/warmup_sweep.py qk --seeds 1,7 --arch qwen3 --init zero-proj
    # every row so far
    python lab/warmup_sweep.py --table

One JSON row per (recipe, seed) is appended to out/sweep/results.jsonl (``--out`` names another
folder) as each seed ends, so an interrupted sweep keeps what it finished; a finished warm-up is
never trained twice.
"""
import argparse
import functools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import model  # noqa: E402
import runs  # noqa: E402
import train  # noqa: E402
import warmup  # noqa: E402
from lab import report  # noqa: E402

PREV_TOKEN_HEAD = model.prev_token_head   # before --init offsetK replaces it for one probe


def seeds_from(text):
    """'0-9' or '1,2,7' as a list of ints."""
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(s) for s in text.split(",")]


def table(rows):
    """Rows by recipe: seeds, settings, final loss, validation EM, warm-up seconds, each seed
    shown."""
    lines = ["| recipe | settings | seeds | final loss | val 1-hop EM | val macro | warm-up s |",
             "|---" * 7 + "|"]
    by_recipe = {}
    for r in rows:
        by_recipe.setdefault(r["recipe"], []).append(r)
    for name, rs in by_recipe.items():
        cell = lambda key, spec: " ".join(format(r[key], spec) for r in rs)
        settings = (" ".join(rs[0]["overrides"])
                    + (f" shape {rs[0]['shape']}" if rs[0]["shape"] else ""))
        lines.append(f"| {name} | {settings or 'defaults'} | "
                     f"{' '.join(str(r['seed']) for r in rs)} | "
                     f"{cell('final_loss', '.2f')} | {cell('val_hop1', '.2f')} | "
                     f"{cell('val_macro', '.2f')} | {cell('warmup_s', '.0f')} |")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?", help="the recipe's name: its warm-ups go to OUT/NAME/")
    ap.add_argument("--table", action="store_true",
                    help="print every recipe's rows as one Markdown table")
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--shape", default=None,
                    help="hidden,layers,heads,kv_heads,mlp of MODEL (default: model.SIZES)")
    ap.add_argument("--init", default=None,
                    help="probe only: zero-proj = residual output projections start at 0; "
                    "qkSTD = query and key projections drawn with std STD (HF: 0.02); "
                    "allSTD = every matrix; "
                    "offsetK = the previous-token head moved to K tokens back (a control; "
                    "its strength: train.py's --PREV_TOKEN_INIT)")
    ap.add_argument("--arch", default=None,
                    help="probe only: qwen3 = the same shape with QK-norm (Qwen3)")
    ap.add_argument("--worlds", type=int, default=2, help="validation worlds to evaluate on")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "sweep"),
                    help="the sweep's folder: each recipe's warm-ups and results.jsonl")
    args, overrides = ap.parse_known_args(argv)
    root = args.out
    if args.table:
        path = os.path.join(root, "results.jsonl")
        if not os.path.exists(path):
            raise SystemExit(f"{path}: no sweep has run yet (the committed probes' rows are in "
                             "lab/results/warmup-probes-2026-12-04.jsonl)")
        return print(table([json.loads(line) for line in open(path)]))
    if not args.name:
        ap.error("give the recipe's name (or --table)")
    os.makedirs(root, exist_ok=True)
    # model.build_model's config and seeding, with Qwen3's layers (QK-norm)
    if args.arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        model.Qwen2Config = lambda **kw: Qwen3Config(
            head_dim=kw["hidden_size"] // kw["num_attention_heads"], **kw)
        model.Qwen2ForCausalLM = Qwen3ForCausalLM
    for seed in seeds_from(args.seeds):
        cfg, _, _ = train.configure([f"--SEED={seed}", f"--SFT_DIR={root}/{args.name}/sft",
                                     "--DEVICE=cpu"] + overrides)
        if args.shape:                          # the warm-up's cache key holds the shape too
            model.SIZES[cfg["MODEL"]] = tuple(int(x) for x in args.shape.split(","))
        # a control: the head attends K tokens back, not 1
        if args.init and args.init.startswith("offset"):
            model.prev_token_head = functools.partial(
                PREV_TOKEN_HEAD, back=int(args.init.removeprefix("offset")))
        device, dtype = runs.pick_device(cfg)
        started = time.perf_counter()
        lm, tok = train.build_policy(cfg, device)
        if args.init == "zero-proj":
            with torch.no_grad():
                for layer in lm.model.layers:
                    layer.self_attn.o_proj.weight.zero_()
                    layer.mlp.down_proj.weight.zero_()
        # qk: sharper attention from step 0, the rest as HF draws it
        elif args.init and args.init.startswith(("qk", "all")):
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                if args.init.startswith("qk"):
                    matrices = [p.weight for layer in lm.model.layers
                                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj)]
                # every linear layer and the (tied) embedding; norms and biases as HF sets them
                else:
                    matrices = [p for p in lm.parameters() if p.dim() == 2]
                std = float(args.init.removeprefix("qk").removeprefix("all"))
                for w in matrices:
                    w.copy_(torch.randn(w.shape, generator=generator) * std)
        path = warmup.run(cfg, lm, tok, rank=0)
        state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
        losses = state.get("losses", [])
        em = report.cached_em(path, lm.eval(), tok, cfg, args.worlds, validation=True)
        row = {"recipe": args.name, "seed": seed, "overrides": overrides, "shape": args.shape,
               "init": args.init, "arch": args.arch,
               "params": sum(p.numel() for p in lm.parameters()),
               "warmup_s": round(state.get("seconds", 0), 1),
               "final_loss": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 4),
               "loss_every_50": losses[49::50], "val_hop1": em["hop1"], "val_hop2": em["hop2"],
               "val_macro": em.get("macro"), "total_s": round(time.perf_counter() - started, 1),
               "path": path}
        print(json.dumps({k: v for k, v in row.items() if k != "loss_every_50"}), flush=True)
        with open(os.path.join(root, "results.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
