"""packs.py: each benchmark's pack holds every run its report step evaluated, gives back what the
run directories held, and rebuilds a table; packing refuses what it could not restore."""
import gzip
import importlib.util
import json
import os
import re
import statistics

import pytest

import runs
from lab import packs, report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")


def pack_of(version):
    return os.path.join(RESULTS, f"{version}-runs.jsonl.gz")


def stdlib_read(path):
    """A pack's objects by name, read as its docstring tells a reader with no lab code."""
    with gzip.open(path, "rt") as f:
        return {o["name"]: o for o in map(json.loads, f)}


@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
def test_each_pack_holds_every_run_its_report_evaluated(version):
    # results-vN.json is the protocol's report step (evaluate.py --json over out/vN): its runs
    # and the pack's must be the same ones, each record named for its config's method and seed.
    results = json.load(open(os.path.join(RESULTS, f"results-{version}.json")))
    evaluated = [os.path.basename(r["run"]) for r in results["runs"]]
    objects = stdlib_read(pack_of(version))
    records = {n: o for n, o in objects.items() if "config" in o}
    probes = sorted(n for n in records if n.startswith("probe-"))
    assert sorted(set(records) - set(probes)) == sorted(evaluated)
    assert len(records) - len(probes) == len(evaluated)
    for name, run in records.items():
        assert name.endswith(f"-s{run['config']['SEED']}")
        assert run["metrics"] and all(isinstance(m["step"], int) for m in run["metrics"])
        # probes (v4's regime search) were read on validation worlds, the rest on held-out ones
        assert ("heldout_em" in run) != name.startswith("probe-")
        assert ("validation" in run) == name.startswith("probe-")
    if version == "v3":
        # the protocol's log names the start of every run, and only those
        log = objects["protocol.log"]["text"]
        started = re.findall(r"^\d\d:\d\d:\d\d (\S+) seed (\d+)$", log, re.M)
        assert sorted(f"{g}-s{s}" for g, s in started) == sorted(records)
    else:
        assert set(objects) == set(records)
    assert (len(probes) > 0) == (version == "v4")


def test_a_pack_gives_back_the_run_directories(tmp_path):
    # Unpacked, each run's metrics read from its directory are the pack's rows (benchmark v5's
    # grpo-s6, logged across a restart, whole), and packing the directories again gives the
    # committed bytes.
    path = pack_of("v5")
    packs.unpack(path, tmp_path / "v5-runs")
    for run in packs.run_records(path):
        assert runs.read_metrics(tmp_path / "v5-runs" / run["name"]) == run["metrics"]
    packs.pack(tmp_path / "v5-runs", tmp_path / "again.jsonl.gz")
    assert (tmp_path / "again.jsonl.gz").read_bytes() == open(path, "rb").read()


def test_a_log_written_across_a_restart_reads_as_its_last_attempt(capsys):
    # What code before the clean restart left (benchmark v5's grpo-s6): an attempt's rows, then
    # the restarted run's from step 0.
    logged = [{"step": 0, "eval": True}, {"step": 0}, {"step": 1}, {"step": 2},
              {"step": 0, "eval": True}, {"step": 0}, {"step": 1}]
    assert packs.metrics({"name": "grpo-s6", "metrics": logged}, "v5.jsonl.gz") == logged[4:]
    assert ("v5.jsonl.gz: grpo-s6/metrics.jsonl: the run restarted from the warm-up; the 4 rows"
            in capsys.readouterr().err)
    doubled = next(r for r in packs.run_records(pack_of("v5")) if r["name"] == "grpo-s6")
    assert len(packs.metrics(doubled)) < len(doubled["metrics"])


def test_v4_table_of_means_rebuilds_from_the_pack():
    # v4_tables' first table, rebuilt from the pack, against each method's runs read from the
    # pack with the standard library alone.
    spec = importlib.util.spec_from_file_location("v4_tables",
                                                  os.path.join(RESULTS, "v4_tables.py"))
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    lines = tables.means(tables.rows(pack_of("v4"))).splitlines()[2:]
    records = [r for r in stdlib_read(pack_of("v4")).values() if "heldout_em" in r]
    assert len(lines) == len({r["config"]["METHOD"] for r in records})
    for line in lines:
        method, seeds, macro = line.split(" | ")[:3]
        mine = [r["heldout_em"][report.em_key(r["config"], tables.WORLDS)]["macro"]
                for r in records if r["config"]["METHOD"] == method.strip("| ")]
        assert int(seeds) == len(mine)
        assert macro == f"{statistics.mean(mine):.3f}"


def test_pack_refuses_a_file_it_could_not_restore_and_add_replaces_by_name(tmp_path):
    run = tmp_path / "runs" / "grpo-s0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"SEED": 0}, indent=1))
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "loss": 0.5}\n')
    packs.pack(tmp_path / "runs", tmp_path / "p.jsonl.gz")
    assert packs.run_records(tmp_path / "p.jsonl.gz")[0]["metrics"][1] == {"step": 1, "loss": 0.5}
    newer = dict(packs.record(run), metrics=[{"step": 0}])
    packs.add(tmp_path / "p.jsonl.gz", [newer])
    assert packs.run_records(tmp_path / "p.jsonl.gz") == [newer]
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "lo')   # a torn last line
    with pytest.raises(SystemExit, match="metrics.jsonl: not as json.dump wrote it"):
        packs.record(run)
    (run / "notes.txt").write_text("")
    with pytest.raises(SystemExit, match="notes.txt: not a file a pack holds"):
        packs.pack(tmp_path / "runs", tmp_path / "q.jsonl.gz")
