"""How the sampling temperature scales EviSD's gap (issue 45): the same sampled tokens scored by
student and teacher at T = 0.5 (TEMPERATURE, what training uses) and at T = 1 (the paper's).

    python lab/results/gap_temperature.py WARMUP_DIR    # e.g. out/v5/sft-f9d65139d7 (seed 0)

Three batches of 8 training questions x 8 samples, each in its own fresh world, sampled at 0.5
as training samples; every episode re-scored (aligned contexts, content span). Prints, per
action kind, the mean |gap| at each temperature and their ratio, and the share of tokens where
tanh(tau * gap) is saturated (|tau * gap| > 2) at each.
"""
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import evisd  # noqa: E402
import model  # noqa: E402
import rollout  # noqa: E402
import search_env  # noqa: E402
import toy_world  # noqa: E402
import train  # noqa: E402

TEMPERATURES = (0.5, 1.0)


def main(warmup_dir):
    cfg = dict(train.DEFAULTS)
    lm, tok = model.load_model(warmup_dir, local_files_only=True)
    lm.eval()
    gaps = {t: [] for t in TEMPERATURES}
    kinds = []
    for batch in range(3):
        world = toy_world.make_world(seed=f"gap-temperature-{batch}")
        questions = random.Random(batch).sample(world.split("train"), 8)
        envs = search_env.episodes(world, questions, 8, cfg["MAX_TURNS"], cfg["TOP_K"])
        torch.manual_seed(batch)
        with torch.no_grad():
            r = rollout.rollout(lm, tok, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
        rows = list(range(len(r.rewards)))
        m = evisd.correction_mask(r, cfg)   # the same at any temperature
        for t in TEMPERATURES:
            settings = dict(cfg, TEMPERATURE=t)
            with torch.no_grad():
                lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask,
                                            temperature=t)
            lp_t = evisd.teacher_logprobs(lm, tok, world, r, lp_s, rows, settings)
            gaps[t].append((lp_t - lp_s)[m])
        kinds.append(r.action_kind[m])
    kind = torch.cat(kinds)
    tau = cfg["EVISD_TAU"]
    print("| kind | tokens | mean abs gap, T=0.5 | T=1 | ratio | share saturated, T=0.5 | T=1 |")
    print("|---|---|---|---|---|---|---|")
    for name in ("search", "answer"):
        g = {t: torch.cat(gaps[t])[kind == rollout.KIND_IDS[name]] for t in TEMPERATURES}
        size = {t: g[t].abs().mean().item() for t in TEMPERATURES}
        saturated = {t: ((tau * g[t]).abs() > 2).float().mean().item() for t in TEMPERATURES}
        print(f"| {name} | {len(g[0.5])} | {size[0.5]:.3f} | {size[1.0]:.3f} | "
              f"{size[0.5] / size[1.0]:.2f} | {saturated[0.5]:.2f} | {saturated[1.0]:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
