"""Every command lab/README.md and lab/results/README.md name is run by a test, on the smallest
real input, and checked on what it printed or wrote. COMMANDS says which test runs each. This
file's toy runs share one warm-up, and the scripts that read a run read one tiny run (``tiny``).

A script that imports torch runs here as ``python SCRIPT ARGS`` would, in this process (its
``__main__`` block, sys.argv set, from the repository root): a subprocess would import torch and
transformers again, seconds each. Those that import neither run as subprocesses.

A model small enough for a test writes no actions, so where a command needs searches, answers
and mixed rewards (MEASURE's labels, the peers' rules, the credit picture, the gap at two
temperatures), a noisy expert plays each episode in its place (``expert_play``); the rest of the
command runs as it is."""
import glob
import gzip
import json
import math
import os
import random
import re
import runpy
import subprocess
import sys

import pytest
import torch

import model
import rollout
import toy_world
import train
from conftest import DEVICE
from test_call_graph import MOST
from test_real_data import DATA, NQ, SMALL
from test_train import rows, run, strip_timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "lab", "results")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# command -> the test that runs it end to end ("file::test"; a test of this file: its name)
GPU_CHECK = "lab/tests/test_gpu_check.py::test_dry_mode_runs_every_part_and_writes_the_report"
REPORT = "lab/tests/test_report.py::test_tables_speed_curves_and_credit_report_end_to_end"
HOTPOT = "lab/tests/test_real_data.py::test_standin_runs_rl_and_evaluate_on_hotpotqa"
SERVER = ("lab/tests/test_real_data.py::"
          "test_a_server_that_stays_down_stops_the_run_after_saving_a_checkpoint")
TABLES = "test_table_scripts_print_the_committed_tables"
COMMANDS = {
    "lab/gpu_check.py OUT --dry": GPU_CHECK,
    "lab/bench.py": GPU_CHECK,                 # its bench and rollout parts, tiny sizes
    "lab/gpu_memory.py tiny --dry": GPU_CHECK,
    "lab/gpu_memory.py tiny --dry --lora R --layers N":
        "lab/tests/test_gpu_memory.py::test_lora_trains_a_rank_r_pair_on_every_projection",
    "lab/export.py RUN OUT":
        "lab/tests/test_lora_export.py::test_a_lora_run_resumes_is_evaluated_and_merges",
    "lab/precision.py RUN [--experts]": "test_precision_on_a_run",
    "lab/warmup_sweep.py NAME --seeds S, --table": "test_warmup_sweep_and_its_table",
    "lab/bm25_scale.py N": "test_bm25_scale",
    "lab/call_graph.py --NAME=value": "test_call_graph_command",
    "lab/packs.py pack|unpack": "test_packs_unpack_then_pack_gives_the_committed_bytes",
    "lab/report.py RUN... --speed --plot, --credit, --variants, --show": REPORT,
    "lab/report.py RUN... --credit-page HTML [--NAME=value]":
        "lab/tests/test_credit_page.py::test_the_fast_loop_page",
    "lab/report.py RUN --credit --rules":
        "lab/tests/test_credit.py::test_rules_mode_end_to_end_through_the_report",
    "train.py --DATA=hotpotqa": HOTPOT,
    "train.py --DATA=jsonl --RETRIEVER_URL=...": SERVER,
    "train.py --DATA=2wiki|musique, --DATA=jsonl --CORPUS=...": "test_train_on_real_data",
    "train.py --METHOD=rlsd|opsd|sdar|sd_search|bicaa": "test_train_with_each_peer",
    "train.py --MEASURE=True": "test_measure_logs_labels_and_gap_statistics",
    "train.py --DECODE=static": "test_static_decode_trains_as_generate_does",
    "lab/results/v3_tables.py": TABLES,
    "lab/results/v4_tables.py": TABLES,
    "lab/results/v5_tables.py --plot PNG": TABLES,
    "lab/results/lora_tables.py [--collect DIR]": "test_lora_tables_print_the_committed_write_up",
    "lab/results/credit_picture.py WARMUP_DIR": "test_credit_picture",
    "lab/results/gap_temperature.py WARMUP_DIR": "test_gap_temperature",
}
# Not run: train.py --DECODE=compiled (minutes of compiling on a CPU; lab/gpu_check.py's rollout
# part runs it on a GPU), the protocols (protocol*.sh: hours), and issue 19's scripts (their
# sources in lab/results/warmup19/scripts.md), kept as the record of the code of their day (they
# call train.sft_batch, gone), not maintained.


def test_every_command_names_a_test_that_exists():
    scripts = {os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/lab/*.py")
               + glob.glob(f"{RESULTS}/*.py") if "__main__" in open(p).read()}
    assert scripts <= {c.split()[0] for c in COMMANDS}
    assert all(os.path.exists(os.path.join(ROOT, c.split()[0])) for c in COMMANDS)
    for test in COMMANDS.values():
        path, _, name = test.rpartition("::")
        assert f"\ndef {name}(" in open(os.path.join(ROOT, path or "lab/tests/test_commands.py")
                                         ).read(), test


def command(monkeypatch, script, *args):
    """Run ``python SCRIPT ARGS`` in this process, from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    monkeypatch.setattr(sys, "path", list(sys.path))          # the script's own inserts go
    runpy.run_path(os.path.join(ROOT, script), run_name="__main__")


def script(*args, timeout=60):
    """``python ARGS`` as a subprocess from the repository root, on one thread."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def expert_rollout(lm, tok, envs, *args, **kwargs):
    """rollout.rollout's stand-in: a noisy expert (toy_world.expert_episode) plays each env, a
    slip in one episode of two and a premature answer in some, so groups have mixed rewards and
    real action spans."""
    rng = random.Random(0)
    transcripts, texts = [], []
    for env in envs:
        episode = toy_world.expert_episode(env.question, env.retriever, noise=0.5, rng=rng,
                                           max_turns=env.max_turns, top_k=env.top_k,
                                           stop_early=0.3)
        observations = [env.step(turn).observation for turn in episode.turns]
        transcripts.append(rollout.encode_episode(tok, model.render_prompt(tok, env.question),
                                                  episode.turns, observations))
        texts.append(episode.turns)
    return rollout.Rollouts(**rollout.collate(transcripts, tok.pad_token_id),
                            rewards=torch.tensor([env.reward for env in envs]),
                            answers=[env.answer for env in envs],
                            turns=torch.tensor([env.turns for env in envs]),
                            questions=[env.question for env in envs], turn_texts=texts,
                            em=torch.tensor([env.em for env in envs]))


@pytest.fixture
def expert_play(monkeypatch):
    monkeypatch.setattr(rollout, "rollout", expert_rollout)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One folder for the file's runs: every run on the toy shares one warm-up, cached."""
    return tmp_path_factory.mktemp("commands")


# Every toy run of this file: episodes long enough for a two-hop expert, groups big enough for
# mixed rewards, one warm-up (cached in ``root``).
TOY = ("--MAX_TURNS=4", "--GROUP_SIZE=4", "--EVAL_EVERY=0", "--PPO_EPOCHS=1")


@pytest.fixture(scope="module")
def tiny(root):
    """(run directory, warm-up directory) of one tiny EviSD run."""
    out = run(root, "tiny", *TOY, "--RL_STEPS=2")
    return out, glob.glob(f"{root}/sft-*")[0]


# ----------------------------------------------------------------------------- train.py's switches
def test_measure_logs_labels_and_gap_statistics(root, expert_play):
    measured = rows(run(root, "measured", *TOY, "--RL_STEPS=2", "--MEASURE=True"))
    plain = rows(run(root, "plain", *TOY, "--RL_STEPS=2"))
    labels = ([f"label_search_{n}" for n in ("hit", "partial", "repeat", "miss")]
              + [f"label_answer_{n}" for n in ("correct", "premature", "wrong")]
              + ["label_decision_wrong", "label_invalid"])
    for row in measured:
        assert set(labels) <= set(row) and all(0 <= row[k] <= 1 for k in labels), row
        assert sum(row[k] for k in labels[:4]) == pytest.approx(1)
        # the oracle's correct answers are the env's exact matches, one answer an episode
        assert row["label_answer_correct"] == pytest.approx(row["em"] / row["answered"])
        for kind in ("search", "answer"):
            assert row[f"{kind}_tokens"] > 0
            assert row[f"{kind}_gap_abs_max"] >= row[f"{kind}_gap_abs_mean"] >= 0
    # the teacher scored the actions of groups with mixed rewards, and moved their A
    for key in ("search_gap_abs_mean", "answer_gap_abs_mean", "modulated_frac"):
        assert max(r[key] for r in measured) > 0, key
    # Measuring changes nothing the step computes; without it, neither labels nor gap stats.
    plain = strip_timing(plain)
    assert [{k: m[k] for k in p} for m, p in zip(strip_timing(measured), plain)] == plain
    assert len(measured) == len(plain) == 2
    assert not [k for k in plain[0] if k.startswith("label_") or "_gap_" in k]


@pytest.mark.parametrize("method", train.PEERS)
def test_train_with_each_peer(root, expert_play, method):
    step = rows(run(root, method, *TOY, "--RL_STEPS=1", f"--METHOD={method}"))[0]
    assert 0 < step["reward"] < 1 and math.isfinite(step["loss"])
    if method in ("sdar", "sd_search"):          # A untouched, a loss term beside it
        assert step["modulated_frac"] == 0 and step["extra_loss"] != 0
    else:                                        # the rule moved some tokens' advantage
        assert 0 < step["modulated_frac"] <= 1 and "extra_loss" not in step


def test_static_decode_trains_as_generate_does(root, tiny):
    static = run(root, "static", *TOY, "--RL_STEPS=2", "--DECODE=static")
    # the same seed samples the same tokens: the same rows, timing aside
    assert strip_timing(rows(static)) == strip_timing(rows(tiny[0]))
    assert all(r["gen_tokens"] > 0 for r in rows(static))


@pytest.mark.parametrize("data", ["2wiki", "musique", "jsonl"])
def test_train_on_real_data(standin_dir, tmp_path, data):
    path = {"2wiki": "2wiki_dev.json", "musique": "musique_dev.jsonl"}.get(data)
    files = [f"--DATA_TRAIN={DATA}/{path}", f"--DATA_DEV={DATA}/{path}"] if path else [
        f"--DATA_TRAIN={NQ}", f"--DATA_DEV={NQ}", f"--CORPUS={DATA}/searchr1_corpus.jsonl"]
    out = str(tmp_path / "run")
    train.main([f"--MODEL={standin_dir}", f"--DATA={data}", *files, f"--OUT_DIR={out}", *SMALL,
                f"--DEVICE={DEVICE}", "--RL_STEPS=1", "--EVAL_EVERY=1", "--EVAL_QUESTIONS=2",
                "--MAX_NEW_TOKENS=8"])
    got = rows(out)
    assert [r["step"] for r in got] == [0, 0, 1]
    assert got[0]["eval_n"] == 2 and 0 <= got[0]["eval_f1"] <= 1 and got[1]["gen_tokens"] > 0
    assert os.path.isdir(os.path.join(out, "ckpt-000001"))


# ----------------------------------------------------------------------------- the lab's scripts
def test_precision_on_a_run(tiny, monkeypatch, capsys, tmp_path):
    header = "| action kind | content tokens (A ≠ 0) | rounding's share of the correction |"
    # the run's own samples: a tiny model writes no action, and the table says so
    command(monkeypatch, "lab/precision.py", tiny[0], "--batches", "1")
    printed = capsys.readouterr().out
    assert header in printed and "| search | 0 | – |" in printed and "--experts" in printed
    command(monkeypatch, "lab/precision.py", tiny[0], "--batches", "2", "--experts",
            "--json", tmp_path / "p.json")
    assert header in capsys.readouterr().out
    for kind, figures in json.load(open(tmp_path / "p.json")).items():
        assert figures["tokens"] > 0 and 0 <= figures["share"] < 1, kind
        assert 0 <= figures["p50_gap"] <= figures["p99_gap"]


def test_warmup_sweep_and_its_table(monkeypatch, capsys, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = ["--WORLD_SCALE=0.15", "--SFT_STEPS=4", "--SFT_BATCH=4", "--MAX_TURNS=2",
                 "--MAX_NEW_TOKENS=12", "--EVAL_QUESTIONS=3"]
    command(monkeypatch, "lab/warmup_sweep.py", "tiny", "--seeds", "0", "--worlds", "1",
            "--out", sweep, *overrides)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = [json.loads(line) for line in open(sweep / "results.jsonl")]
    assert len(saved) == 1 and saved[0]["seed"] == 0 and saved[0]["recipe"] == "tiny"
    assert {k: saved[0][k] for k in printed} == printed
    assert 0 <= printed["val_macro"] <= 1 and printed["final_loss"] > 0
    assert os.path.isdir(printed["path"])
    command(monkeypatch, "lab/warmup_sweep.py", "--table", "--out", sweep)
    table = capsys.readouterr().out
    assert "| recipe | settings | seeds | final loss |" in table
    assert f"| tiny | {' '.join(overrides)} | 0 | {printed['final_loss']:.2f} |" in table


def test_bm25_scale():
    done = script("lab/bm25_scale.py", 2000)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    # each passage: a two-word title and 100 words, some repeated
    assert got["passages"] == 2000 and 2000 * 30 < got["postings"] <= 2000 * 102
    assert 0 < got["vocab"] <= 300_000 and got["build_s"] >= 0
    assert 0 <= got["ms_per_query_median"] <= got["ms_per_query_p95"]


def test_call_graph_command(monkeypatch, capsys):
    command(monkeypatch, "lab/call_graph.py", "--WORLD_SCALE=0.15", "--QUESTIONS_PER_STEP=2",
            "--GROUP_SIZE=2", "--MAX_NEW_TOKENS=12", "--MAX_TURNS=2", f"--DEVICE={DEVICE}")
    lines = capsys.readouterr().out.splitlines()
    head = [line for line in lines if line.startswith("rl_step reaches")][0]
    n, files, core = map(int, re.match(r"rl_step reaches (\d+) named project functions in (\d+) "
                                       r"files \((\d+) of them core files", head).groups())
    per_file = {m[1]: int(m[2]) for m in (re.match(r"  (\S+): (\d+) \(", x) for x in lines) if m}
    assert 0 < n <= MOST and len(per_file) == files == core and sum(per_file.values()) == n
    assert {"train.py", "rollout.py", "grpo.py"} <= set(per_file)


def test_packs_unpack_then_pack_gives_the_committed_bytes(tmp_path):
    pack = os.path.join(RESULTS, "v3-runs.jsonl.gz")
    with gzip.open(pack, "rt") as f:
        names = sorted(json.loads(line)["name"] for line in f)
    done = script("lab/packs.py", "unpack", pack, tmp_path / "v3")
    assert done.returncode == 0 and "unpacked into" in done.stdout, done.stderr
    assert sorted(os.listdir(tmp_path / "v3")) == names                # protocol.log too
    done = script("lab/packs.py", "pack", tmp_path / "v3", tmp_path / "again.jsonl.gz")
    assert done.stdout.startswith(f"{len(names)} objects packed into"), done.stderr
    assert (tmp_path / "again.jsonl.gz").read_bytes() == open(pack, "rb").read()
    done = script("lab/packs.py", "unpack", pack)
    assert done.returncode != 0 and "usage: python lab/packs.py pack" in done.stderr


def block(printed, first):
    """The Markdown table that starts with the line ``first``."""
    lines = printed.splitlines()
    start = lines.index(first)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_table_scripts_print_the_committed_tables(monkeypatch, capsys, tmp_path):
    # Each script rebuilds its write-up's tables from the committed records alone.
    for version, args, first in (
            ("v3", ["lab/results/results-v3.json", tmp_path / "no-logs"],
             "| measure | grpo (mean of 12) | evisd − grpo [95%] (n=12) |"),
            ("v4", [], "| method | seeds | macro | 1-hop | 2-hop | seeds with 2-hop EM > 0.1 |"),
            ("v5", ["--plot", tmp_path / "curves.png"], "| measure | EviSD − GRPO [95%] |")):
        command(monkeypatch, f"lab/results/{version}_tables.py", *args)
        table = block(capsys.readouterr().out, first)
        written = open(os.path.join(RESULTS, f"results-{version}.md")).read()
        assert len(table) > 8 and [line for line in table if line not in written] == [], version
    assert os.path.getsize(tmp_path / "curves.png") > 10_000


def test_lora_tables_print_the_committed_write_up(monkeypatch, capsys, tmp_path):
    command(monkeypatch, "lab/results/lora_tables.py")
    printed = capsys.readouterr().out
    written = open(os.path.join(RESULTS, "lora.md")).read()
    tables = [line for line in printed.splitlines() if line.startswith("|")]
    assert len(tables) > 20 and [line for line in tables if line not in written] == []
    # --collect rebuilds the records from a protocol's directory (here: from the records)
    records = json.load(open(os.path.join(RESULTS, "lora-records.json")))
    exp = tmp_path / "exp"
    (exp / "mem").mkdir(parents=True)
    json.dump({"validation_macro": records["validation_macro"], "chosen": records["chosen_lr"]},
              open(exp / "chosen-lr.json", "w"))
    json.dump(records["heldout"], open(exp / "heldout.json", "w"))
    for p in records["cpu_probes"]:
        name = f"{p['shape']}-l{p['layers']}-r{p['lora_rank']}.json"
        json.dump({k: v for k, v in p.items() if k != "shape"}, open(exp / "mem" / name, "w"))
    monkeypatch.syspath_prepend(RESULTS)
    import lora_tables
    monkeypatch.setattr(lora_tables, "RECORDS", str(tmp_path / "records.json"))
    lora_tables.collect(str(exp))
    assert json.load(open(tmp_path / "records.json")) == records


def test_credit_picture(tiny, expert_play, monkeypatch, capsys, tmp_path):
    command(monkeypatch, "lab/results/credit_picture.py", tiny[1], "--out", tmp_path / "c.png")
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"episode \d+ of its group: reward [01], A = [+-]\d", lines[0])
    assert lines[1] == "| action | text | GRPO | EviSD (the paper's) | whole-response row |"
    actions = [line.split(" | ") for line in lines[3:-1]]
    assert {"search", "answer"} <= {a[0].strip("| ") for a in actions}
    lam = train.DEFAULTS["EVISD_LAMBDA"]
    for a in actions:      # Â / A of each action: GRPO's 1, the others within 1 ± lambda
        grpo, evisd, whole = (float(c.strip(" |")) for c in a[2:])
        assert grpo == 1.0 and abs(evisd - 1) <= lam and abs(whole - 1) <= lam
    assert lines[-1] == f"wrote {tmp_path / 'c.png'}"
    assert os.path.getsize(tmp_path / "c.png") > 10_000


def test_gap_temperature(tiny, expert_play, monkeypatch, capsys):
    command(monkeypatch, "lab/results/gap_temperature.py", tiny[1])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| kind | tokens | mean abs gap, T=0.5 | T=1 | ratio |")
    for kind, line in zip(("search", "answer"), lines[2:4]):
        name, tokens, at_half, at_one, ratio, *saturated = line.strip("| ").split(" | ")
        assert name == kind and int(tokens) > 0 and float(at_one) > 0
        # the gap is a difference of log-probs at logits / T: at T = 0.5, about twice T = 1's
        assert 1.5 < float(ratio) < 2.5 and all(0 <= float(s) <= 1 for s in saturated)
