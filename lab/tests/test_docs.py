"""Every command the project shows runs as shown, up to its first piece of work: each ``python``,
``bash`` and ``torchrun`` line of README.md, docs/*.md, lab/README.md, the presets' docstrings
(config/*.py) and what ``--help`` prints (the docstring of every script), collected here.

Each command is handed to its own program in this process, ``python SCRIPT ARGS`` as the shell
would: its flags are read by its own parser (argparse, or train.py's settings, every value
checked), and the program stops there (``Parsed``), before any model or data is touched. A script
without a parser (the tables, the toy world's tour, bm25_scale.py) runs to its end, writing
under a scratch folder. A renamed
flag, a moved option, a setting that no longer exists or a value out of range fails here, not
for a reader. What each command then does end to end, on tiny settings, the tests of its program
run (lab/tests/test_commands.py names one for every lab command). Placeholders of a usage line
(RUN, OUT, N, [optional], a | b) stand for the smallest real value; NOT_RUN names the few
commands that are not ours to run, each with its reason."""
import argparse
import ast
import glob
import os
import re
import runpy
import sys

import pytest

import evaluate
import runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:python|bash|torchrun)\s")

# command (as the docs write it) -> why it is not run here
NOT_RUN = {
    "python -m pytest -q": "the suite itself: CI runs it (.ci/run)",
    "python -m pytest -q tests": "the core's tests: CI's card-packages pass runs it (.ci/run)",
    "python -m pytest -q -m ci_step": "the slow checks: CI runs them in a step of their own",
    "bash .ci/run": "CI itself",
    "python scripts/download.py --save_path $SAVE": "Search-R1's repository, not this one",
}
NOT_RUN_PREFIX = {
    "python search_r1/": "Search-R1's retrieval server, from its repository",
    "torchrun ": "tests/test_ddp.py runs train.py's data parallel path on two processes",
}

# Scripts with no parser of their own that read real inputs at once: the test named runs each
# end to end on the inputs it builds ("file::test"; a test of test_commands.py: its name).
RUN_BY = {
    "python lab/packs.py pack DIR PACK": "test_packs_unpack_then_pack_gives_the_committed_bytes",
    "python lab/packs.py pack lab/results/v5-runs lab/results/v5-runs.jsonl.gz":
        "test_packs_unpack_then_pack_gives_the_committed_bytes",
    "python lab/results/gap_temperature.py WARMUP_DIR": "test_gap_temperature",
    "python lab/results/lora_tables.py --collect out/lora-exp":
        "test_lora_tables_print_the_committed_write_up",
}


class Parsed(Exception):
    """Raised once a program has read its command line: nothing after it runs."""


def sources():
    """(path, text, markdown) of every place the project shows a command."""
    for path in ["README.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT)), "lab/README.md"]:
        yield path, open(os.path.join(ROOT, path)).read(), True
    scripts = sorted(glob.glob("config/*.py", root_dir=ROOT) + glob.glob("*.py", root_dir=ROOT)
                     + glob.glob("lab/*.py", root_dir=ROOT)
                     + glob.glob("lab/results/*.py", root_dir=ROOT))
    for path in scripts:
        text = open(os.path.join(ROOT, path)).read()
        if path.startswith("config/") or "__main__" in text:
            yield path, ast.get_docstring(ast.parse(text)) or "", False


def commands_in(text, markdown):
    """The commands of a text: in a markdown file, those of its code blocks, indented blocks and
    `inline code`; in a docstring, any line. A trailing comment goes, a continued line joins."""
    found, fenced, lines = [], False, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if markdown and line.strip().startswith("```"):
            fenced = not fenced
        else:
            whole = not markdown or fenced or line.startswith("    ")
            for c in ([line.strip()] if whole else []) + (
                    re.findall(r"`([^`]+)`", line) if markdown else []):
                if COMMAND.match(c.strip()):
                    c = c.strip()
                    while c.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        c = c[:-1] + lines[i].strip()
                    found.append(re.sub(r"\s+#.*$", "", c).strip())
        i += 1
    return found


def documented():
    """{command: [where it is shown]}."""
    where = {}
    for path, text, markdown in sources():
        for c in commands_in(text, markdown):
            where.setdefault(c, []).append(path)
    return where


# A usage line's placeholders, each replaced by a value its parser takes.
PLACEHOLDERS = {"RUN": "out/run", "RUN_DIR": "out/run", "OUT": "out/x", "N": "2", "K": "3",
                "Q": "4", "R": "8", "F": "out/m.json", "RANK": "8", "SHAPE": "tiny", "NAME": "name",
                "DIR": "out/d", "PACK": "out/p.jsonl.gz", "PNG": "out/c.png",
                "WARMUP_DIR": "out/sft", "<its dir>": "out/sft"}


def concrete(command):
    """The runnable forms of a usage line: "a [b] (c | d)" -> "a b c", "a b d"."""
    command = command.replace("\\|", "|").replace("…", "").replace("...", "")
    command = command.replace("--NAME=value", "--METHOD=grpo")
    if m := re.search(r"\[([^\[\]]*\|[^\[\]]*)\]", command):   # [a | b]: one form each
        return [f for alt in m.group(1).split("|")
                for f in concrete(command[:m.start()] + alt.strip() + command[m.end():])]
    words = [PLACEHOLDERS.get(w.strip("[]"), w.strip("[]")) for w in command.split()]
    return [" ".join(w for w in words if w)]


def run_until_parsed(monkeypatch, command, scratch):
    """Hand ``command`` to its program in this process: True once it has read its arguments,
    False where it ran to its end (a script without a parser: the tables, the toy world's tour).
    What it would write (out/..., /tmp/..., a picture) goes under ``scratch``."""
    words = [os.path.join(scratch, w.lstrip("/")) if w.startswith(("out/", "/tmp/"))
             or w.endswith(".png") else w for w in command.split()]
    while "=" in words[0] and not words[0].startswith("-"):      # OMP_NUM_THREADS=1 python ...
        words.pop(0)
    assert words[0] == "python", command
    script, args = words[1], words[2:]
    original_args = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    original_overrides = runs.parse_overrides
    inside = []

    def parse_args(self, args=None, namespace=None):
        self.allow_abbrev = False               # a flag shown is a flag that exists, whole
        inside.append(1)                        # its own parse_known_args: as it was
        original_args(self, args, namespace)
        raise Parsed(command)

    def parse_known_args(self, args=None, namespace=None):
        self.allow_abbrev = False
        namespace, extras = original_known(self, args, namespace)
        if inside:
            return namespace, extras
        # A script's own call: what it leaves are train.py's settings, checked as train.py does.
        original_overrides(extras, *train_schema())
        raise Parsed(command)

    def parse_overrides(argv, defaults, schema):
        original_overrides(argv, defaults, schema)
        raise Parsed(command)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    monkeypatch.setattr(runs, "parse_overrides", parse_overrides)
    # Real data's files are checked by lab/real_data.py's tests; the settings are checked here.
    monkeypatch.setattr(evaluate, "real_data", lambda cfg: None)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])
    try:
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except Parsed:
        return True
    return False


def train_schema():
    import train
    return train.DEFAULTS, train.SCHEMA


COMMANDS = documented()


def test_the_commands_are_collected():
    # each kind of place, and the README's own fast loop
    places = {p for ps in COMMANDS.values() for p in ps}
    assert {"README.md", "docs/one-gpu.md", "lab/README.md", "config/hotpotqa.py",
            "evaluate.py", "lab/report.py"} <= places
    fast = ("python train.py --RL_STEPS=5 --EVAL_EVERY=0 --MEASURE=True --OUT_DIR=out/fast "
            "--overwrite")
    assert fast in COMMANDS and len(COMMANDS) > 80
    assert set(NOT_RUN) | set(RUN_BY) <= set(COMMANDS), set(NOT_RUN) - set(COMMANDS)  # none stale
    for test in RUN_BY.values():
        path, _, name = test.rpartition("::")
        assert f"\ndef {name}(" in open(os.path.join(ROOT, path or "lab/tests/test_commands.py")
                                         ).read(), test


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_documented_command_reads_its_arguments(monkeypatch, tmp_path, command):
    if reason := NOT_RUN.get(command) or next(
            (why for start, why in NOT_RUN_PREFIX.items() if command.startswith(start)), None):
        pytest.skip(reason)
    if command in RUN_BY:
        pytest.skip(f"run end to end by {RUN_BY[command]}")
    for form in concrete(command):
        try:
            parsed = run_until_parsed(monkeypatch, form, str(tmp_path))
        except SystemExit as e:
            pytest.fail(f"{form!r} (shown in {', '.join(COMMANDS[command])}) stops: {e}")
        assert parsed is not None


# ----------------------------------------------------------------------------- the README's claims
README = open(os.path.join(ROOT, "README.md")).read()


def readme_reward():
    """The README's reward edit, as the function it tells a reader to write."""
    bullet = README[README.index("**Another reward.**"):].split("\n- ")[0]
    body = re.search(r"`(return [^`]+)`", bullet).group(1)
    import search_env
    namespace = dict(vars(search_env))
    exec(f"def outcome_reward(answer, question, turns):\n    {body}\n", namespace)
    return namespace["outcome_reward"]


def test_the_readme_reward_edit_shows_in_the_log_and_evaluation_stays_exact_match(
        tmp_path, monkeypatch):
    import search_env
    import train
    from test_train import TINY, rows
    args = TINY + ["--MAX_TURNS=4", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1",
                   f"--SFT_DIR={tmp_path}/sft"]
    policy = train.main(args + [f"--OUT_DIR={tmp_path}/em"])
    cfg = train.configure(args)[0]
    tokenizer = train.build_policy(cfg, "cpu")[1]
    exact = evaluate.heldout_em(policy, tokenizer, cfg, 4)
    monkeypatch.setattr(search_env, "outcome_reward", readme_reward())
    train.main(args + [f"--OUT_DIR={tmp_path}/edited"])
    (before,), (after,) = rows(f"{tmp_path}/em"), rows(f"{tmp_path}/edited")
    # The same episodes (seed 0, the same weights), charged for their turns: the logged reward
    # falls below the logged exact match, which did not move.
    assert after["em"] == before["em"] and after["turns"] == before["turns"] > 2
    assert after["reward"] < before["reward"] and after["reward"] < after["em"]
    # Evaluation reads exact match, never the reward.
    assert evaluate.heldout_em(policy, tokenizer, cfg, 4) == exact


def test_the_picture_shows_what_training_reads():
    """The fields the README's picture hands from the rollout to training are read by the core's
    step (train.py, grpo.py, evisd.py), and the notation's names are the code's."""
    picture = README[README.index("toy_world: questions"):]
    fields = re.search(r"│ ([a-z_, ]+)\n", picture).group(1).split(", ")
    step = "".join(open(os.path.join(ROOT, f)).read() for f in ("train.py", "evisd.py"))
    for name in fields:
        assert re.search(rf"\b(r|rollouts)\.{name}s?\b", step), name
    notation = README[README.index("## Notation"):README.index("### The paper")]
    for name in re.findall(r"^\| `([a-z_]+)`", notation, re.M) + re.findall(
            r"\(`([a-z_]+)`\)", notation):
        assert re.search(rf"\b{name}\b", step), name
