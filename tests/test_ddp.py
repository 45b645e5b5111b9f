"""Data parallel: two CPU processes (gloo) train for two steps and end with identical weights."""
import os
import socket
import time

import torch
import torch.multiprocessing as mp

import train
from test_train import TINY


def _worker(rank, out_dir, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Each rank gets different advantages, so its local gradients differ: the ranks can only
    # agree at the end if the gradients really are averaged (runs.all_reduce_gradients).
    gen = torch.Generator().manual_seed(rank)
    train.grpo.group_advantages = (
        lambda rewards, group_size: torch.randn(len(rewards), generator=gen))
    lm = train.main(TINY + ["--RL_STEPS=2", "--EVAL_EVERY=0", "--DEVICE=cpu", "--LR=0.01",
                            f"--OUT_DIR={out_dir}/run", f"--SFT_DIR={out_dir}/sft"])
    flat = torch.cat([p.detach().flatten() for p in lm.parameters()])
    torch.save(flat, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_ranks_end_with_identical_weights(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_worker, args=(str(tmp_path), port), nprocs=2, join=False)
    deadline = time.monotonic() + 300  # a hung collective must fail the test, not stall CI
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError("the two ranks did not finish within 300 s (hung collective?)")
    w0, w1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(w0, w1)
    sft = [d for d in os.listdir(tmp_path) if d.startswith("sft-")]
    from transformers import AutoModelForCausalLM
    start = torch.cat([p.detach().flatten() for p in
                       AutoModelForCausalLM.from_pretrained(tmp_path / sft[0]).parameters()])
    assert (start - w0).abs().max() > 1e-4                  # the RL steps really updated them
    assert os.path.isdir(tmp_path / "run" / "ckpt-000002")  # rank 0 wrote the checkpoint
    assert len(open(tmp_path / "run" / "metrics.jsonl").readlines()) == 2
