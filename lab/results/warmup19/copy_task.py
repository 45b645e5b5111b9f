"""Probe (session 5): how fast does the tiny model learn to copy names with nothing else to learn?
Rows of COPY_NAMES random names (one or two words of two of the world's syllables), then the
same names in another order; the loss is on the second half only, where a name's first token
is a guess and its later tokens are a copy. A constant rate after a 30-step linear warm-up;
the mean loss of every 50 steps is printed.

    python lab/results/warmup19/copy_task.py SEED STEPS ROWS LR        # session 5: 1 1200 32 3e-3, and 1e-3
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import model as M  # noqa: E402
import toy_world as tw  # noqa: E402
import train  # noqa: E402

COPY_NAMES = int(os.environ.get("COPY_NAMES", "8"))


def random_name(rng):
    """One or two words of two syllables, like the world's names."""
    return " ".join("".join(rng.choice(tw.SYLLABLES) for _ in range(2)) for _ in range(rng.choice((1, 2))))


def copy_batch(tokenizer, rng, rows):
    """[rows, T] ids, attention mask and loss mask: names, then the same names shuffled."""
    seqs = []
    for _ in range(rows):
        names = [random_name(rng) for _ in range(COPY_NAMES)]
        first = tokenizer.encode(" " + ", ".join(names) + ".", add_special_tokens=False)
        second = tokenizer.encode(" " + ", ".join(rng.sample(names, len(names))) + ".", add_special_tokens=False)
        seqs.append((first, second))
    T = max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((rows, T), tokenizer.pad_token_id)
    att, loss_mask = torch.zeros(rows, T, dtype=torch.long), torch.zeros(rows, T, dtype=torch.long)
    for i, (a, b) in enumerate(seqs):
        ids[i, :len(a) + len(b)] = torch.tensor(a + b)
        att[i, :len(a) + len(b)] = 1
        loss_mask[i, len(a):len(a) + len(b)] = 1
    return ids, att, loss_mask


def main(seed, steps, rows, lr):
    cfg, _, _ = train.configure([f"--SEED={seed}", "--DEVICE=cpu"])
    lm, tok = train.build_model(cfg, "cpu")
    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0)
    lm.train()
    started, losses = time.time(), []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 30)
        ids, att, loss_mask = copy_batch(tok, random.Random(f"copy/{seed}/{step}"), rows)
        loss = -(M.token_logprobs(lm, ids, att, loss_mask) * loss_mask).sum() / loss_mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg["GRAD_CLIP"])
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            print(step + 1, round(sum(losses[-50:]) / 50, 3), round(time.time() - started, 1), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
