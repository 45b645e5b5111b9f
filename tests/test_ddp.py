"""Data parallel: two CPU processes (gloo) train for two steps and end with identical weights;
one step's averaged gradient is the single process's on the same batch, every token alike."""
import os
import random
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import model
import rollout
import toy_world
import train
from test_train import TINY


def _worker(rank, out_dir, port, second_port):
    """Rank ``rank`` of two: two training steps, then one step's gradient on a fixed batch, and
    on rank 0 that step's gradient alone in one process."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Each rank gets different advantages, so its local gradients differ: the ranks can only
    # agree at the end if the gradients really are averaged (runs.all_reduce_gradients).
    gen, group_advantages = torch.Generator().manual_seed(rank), train.grpo.group_advantages
    train.grpo.group_advantages = (
        lambda rewards, group_size: torch.randn(len(rewards), generator=gen))
    lm = train.main(TINY + ["--RL_STEPS=2", "--EVAL_EVERY=0", "--DEVICE=cpu", "--LR=0.01",
                            f"--OUT_DIR={out_dir}/run", f"--SFT_DIR={out_dir}/sft"])
    flat = torch.cat([p.detach().flatten() for p in lm.parameters()])
    torch.save(flat, os.path.join(out_dir, f"rank{rank}.pt"))
    train.grpo.group_advantages = group_advantages
    os.environ["MASTER_PORT"] = str(second_port)
    dist.init_process_group("gloo")
    torch.save(step_gradient(), os.path.join(out_dir, f"grad{rank}.pt"))
    dist.destroy_process_group()
    if rank == 0:          # then alone, on both questions: the one-process gradient
        torch.save(step_gradient(), os.path.join(out_dir, "grad-one.pt"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The folder where the two ranks of _worker left their weights and gradients."""
    out = tmp_path_factory.mktemp("ddp")
    ctx = mp.spawn(_worker, args=(str(out), free_port(), free_port()), nprocs=2, join=False)
    deadline = time.monotonic() + 300  # a hung collective must fail the test, not stall CI
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError("the two ranks did not finish within 300 s (hung collective?)")
    return out


def test_two_ranks_end_with_identical_weights(two_ranks):
    tmp_path = two_ranks
    w0, w1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(w0, w1)
    sft = [d for d in os.listdir(tmp_path) if d.startswith("sft-")]
    from transformers import AutoModelForCausalLM
    start = torch.cat([p.detach().flatten() for p in
                       AutoModelForCausalLM.from_pretrained(tmp_path / sft[0]).parameters()])
    assert (start - w0).abs().max() > 1e-4                  # the RL steps really updated them
    assert os.path.isdir(tmp_path / "run" / "ckpt-000002")  # rank 0 wrote the checkpoint
    assert len(open(tmp_path / "run" / "metrics.jsonl").readlines()) == 2


# ----------------------------------------------------------------------------- token weighting
STEP = TINY + ["--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=4", "--PPO_EPOCHS=1", "--GRAD_CLIP=1e9",
               "--DEVICE=cpu"]


def expert_rollouts(policy, tokenizer, envs, *args, **kwargs):
    """In place of a rollout: noisy expert episodes of the envs' questions, of unequal lengths,
    rewarded 1, 0, 1, 0, ... in each group, the same for a question on any rank."""
    world, transcripts = envs[0].retriever, []
    for j, env in enumerate(envs):
        ep = toy_world.expert_episode(env.question, world, noise=0.5, max_turns=4,
                                      rng=random.Random(f"{env.question.qid}/{j % 4}"))
        transcripts.append(rollout.encode_episode(
            tokenizer, model.render_prompt(tokenizer, env.question), ep.turns, ep.observations))
    rewards = torch.tensor([float(j % 2 == 0) for j in range(len(envs))])
    return rollout.Rollouts(**rollout.collate(transcripts, tokenizer.pad_token_id),
                            rewards=rewards, answers=[None] * len(envs),
                            turns=torch.tensor([len(t.spans) for t in transcripts]),
                            questions=[env.question for env in envs], em=rewards.bool())


def step_gradient():
    """(the gradient rl_step hands AdamW, this rank's generated tokens), in this process."""
    torch.set_num_threads(1)
    train.rollout.rollout = expert_rollouts
    cfg = train.configure(STEP)[0]
    policy, tokenizer = train.build_policy(cfg, torch.device("cpu"))
    grads = []

    def record(self, *args, **kwargs):      # in place of the update: the gradient it would take
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    torch.optim.AdamW.step = record
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    _, step = train.rl_step(cfg, 0, train.step_world(cfg, 0), policy,
                            train.frozen_reference(policy), tokenizer, optimizer)
    return grads[0], int(step["rollouts"].gen_mask.sum())


def test_two_ranks_take_the_one_process_gradient_every_token_alike(two_ranks):
    """Two ranks, each with one question's episodes of unequal total length: their averaged
    gradient is the single process's on both questions (each rank dividing by its own token
    count would weigh a token of the shorter rank's more)."""
    (g0, n0), (g1, n1), (one, n) = (torch.load(two_ranks / f"grad{r}.pt")
                                    for r in ("0", "1", "-one"))
    assert n0 != n1                                    # the ranks' token counts differ
    assert torch.equal(g0, g1)                         # averaged: every rank takes one step
    assert n == n0 + n1 and one.abs().max() > 1e-4
    assert torch.allclose(g0, one, rtol=1e-4, atol=1e-7), (g0 - one).abs().max()
