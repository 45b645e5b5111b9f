"""Which tokens does a warm-up get right? Teacher-forced on clean expert episodes of 60 one-hop
questions of validation world 0, the share of tokens whose argmax is the expert's, by kind:
inside <search> and <answer> by position (0 is the tag, 1 the name's first token, 4 stands for
4 and later), and the thoughts and tags together.

    python lab/results/warmup19/token_accuracy.py out/sweep/ctx1-450/sft-6f44b52a5c [hidden,layers,heads,kv,mlp]
"""
import collections
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import evaluate  # noqa: E402
import model as M  # noqa: E402
import toy_world as tw  # noqa: E402
import train  # noqa: E402

KINDS = {1: "search", 2: "answer"}


def token_accuracy(path, shape=None):
    if shape:
        M.SIZES["tiny"] = tuple(int(x) for x in shape.split(","))
    cfg, _, _ = train.configure(["--DEVICE=cpu"])
    lm, tok = train.build_model(cfg, "cpu")
    M.put_weights(lm, M.read_weights(path)[0])
    world = tw.make_world(seed=evaluate.eval_world_seed(cfg, 0, validation=True))
    rng, transcripts = random.Random(0), []
    for q in [q for q in world.split("test") if q.hops == 1][:60]:
        ep = tw.expert_episode(q, world, noise=0.0, rng=rng, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"],
                               stop_early=0.0, partial_name=0.0)
        transcripts.append(M.encode_episode(tok, M.render_prompt(tok, q), ep.turns, ep.observations))
    b = M.collate(transcripts, tok.pad_token_id)
    with torch.no_grad():
        logits = lm.eval()(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    right = (logits[:, :-1].argmax(-1) == b["input_ids"][:, 1:]).tolist()
    kind, gen = b["action_kind"][:, 1:].tolist(), b["gen_mask"][:, 1:].tolist()
    counts = collections.defaultdict(lambda: [0, 0])   # key -> [right, all]
    for i in range(len(transcripts)):
        previous, position = 0, 0
        for t in range(len(right[i])):
            if not gen[i][t]:
                previous = 0
                continue
            if kind[i][t] in KINDS:   # the position inside this action: 0 at its tag
                position = position + 1 if previous == kind[i][t] else 0
                key = f"{KINDS[kind[i][t]]}{min(position, 4)}"
            else:
                key = "thoughts/tags"
            previous = kind[i][t]
            counts[key][0] += right[i][t]
            counts[key][1] += 1
    return {k: round(r / n, 2) for k, (r, n) in sorted(counts.items())}


if __name__ == "__main__":
    print(sys.argv[1], json.dumps(token_accuracy(*sys.argv[1:3])))
