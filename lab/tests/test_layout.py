"""The maintainers' checks of the layout: the teaching core reads and runs on its own, within its
weight; the lab imports the core, and the core reaches the lab only through runs.lab, where a lab
feature is switched on. They sit among the lab's tests, so that a student's edit of the core
keeps ``python -m pytest -q tests`` green; CI runs them."""
import ast
import os
import shutil
import subprocess
import sys

import pytest

from test_train import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = ("search_env.py", "toy_world.py", "model.py", "rollout.py", "grpo.py", "evisd.py",
        "warmup.py", "runs.py", "train.py", "evaluate.py")
PROJECT = {name[:-3] for name in CORE} | {"lab"}


def project_imports(name):
    """The project modules a file imports, anywhere in it (top-level names: lab.x is lab)."""
    tree = ast.parse(open(os.path.join(ROOT, name)).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found & PROJECT


def test_the_formulas_stand_alone_and_arrows_point_down():
    assert project_imports("grpo.py") == set()
    assert project_imports("evisd.py") == {"model", "rollout", "search_env"}
    assert project_imports("rollout.py") == {"model", "search_env"}
    assert project_imports("model.py") == {"search_env", "toy_world"}
    assert project_imports("search_env.py") == set()
    for name in CORE:
        assert "lab" not in project_imports(name), name       # only runs.lab reaches the lab
        assert name == "train.py" or "train" not in project_imports(name), name


def test_the_core_keeps_its_weight():
    # the maintainers' budget: the core in at most 2,400 lines (2,300 left no room for fixes)
    assert sum(len(open(os.path.join(ROOT, name)).read().splitlines()) for name in CORE) <= 2400
    assert set(CORE) == {n for n in os.listdir(ROOT) if n.endswith(".py")} - {"conftest.py"}


def test_lines_are_short():
    for name in CORE:
        lengths = [len(line) for line in open(os.path.join(ROOT, name)).read().splitlines()]
        assert max(lengths) <= 100, name


def test_the_core_runs_without_the_lab(tmp_path):
    """A checkout without lab/: train.py and evaluate.py run the toy world, GRPO and EviSD; a
    lab feature says in one line what it needs."""
    for name in CORE:
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    shutil.copytree(os.path.join(ROOT, "config"), tmp_path / "config")

    def python(*args):
        return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=240)

    flags = [a for a in TINY if not a.startswith("--DEVICE")] + ["--RL_STEPS=2", "--DEVICE=cpu"]
    for method in ("evisd", "grpo"):
        done = python("train.py", *flags, f"--METHOD={method}", f"--OUT_DIR=out/{method}-s0")
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"saved out/{method}-s0/ckpt-000002" in done.stdout
    done = python("evaluate.py", "out/evisd-s0", "out/grpo-s0", "--worlds", "1")
    assert (done.returncode == 0
            and "evisd − grpo, paired by seed" in done.stdout), done.stderr[-2000:]
    done = python("train.py", "--DATA=hotpotqa")
    assert done.returncode == 1 and "lab/real_data.py" in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0                     # one line, no traceback


def test_a_missing_lab_is_one_line(monkeypatch):
    import runs
    # As if the folder were not there (and nothing of it imported yet).
    monkeypatch.setitem(sys.modules, "lab", None)
    monkeypatch.setitem(sys.modules, "lab.credit", None)
    with pytest.raises(SystemExit, match="^--credit needs lab/credit.py"):
        runs.lab("credit", "--credit")
