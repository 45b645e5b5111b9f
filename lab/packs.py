"""A benchmark's run records packed in one file, lab/results/v5-runs.jsonl.gz (v3, v4 alike): a
gzip'd JSON-lines file, one object per run, sorted by name, that the standard library reads:

    import gzip, json
    runs = [json.loads(line) for line in gzip.open("lab/results/v5-runs.jsonl.gz", "rt")]

A run's object holds its directory's files, parsed: "name" (the directory's, e.g. "grpo-s6"),
"config" (config.json), "metrics" (every row of metrics.jsonl in the file's order; a log written
across a restart whole, as the run left it: ``metrics`` reads its last attempt),
"heldout_em" (heldout-em.json) and "validation" (validation.json), the last two where the run
has them. A file of the folder that is no run's (v3's protocol.log) is an object with "name"
and "text". Each file is written back exactly as the code that wrote it did (config and EM with
json.dump's indent=1, metrics a json.dumps row per line), so ``unpack`` restores the directories
byte for byte, and ``pack`` refuses a file it could not restore so.

    python lab/packs.py pack lab/results/v5-runs lab/results/v5-runs.jsonl.gz
    python lab/packs.py unpack lab/results/v5-runs.jsonl.gz /tmp/v5-runs
"""
import gzip
import json
import os
import sys

# a run directory's file -> its key in the run's object; metrics.jsonl is a row per line
FILES = {"config.json": "config", "metrics.jsonl": "metrics", "heldout-em.json": "heldout_em",
         "validation.json": "validation"}


def dump(key, value):
    """The text of a run's file as the code that wrote it did."""
    if key == "metrics":
        return "".join(json.dumps(row) + "\n" for row in value)
    return json.dumps(value, indent=1)


# newline="": the text as it is on disk, line ends untranslated
def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write_text(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def record(run_dir, heldout_em=None):
    """One run's object from its directory; ``heldout_em`` names the EM file where it is not in
    the directory (protocol-v5.sh leaves it in the final checkpoint's)."""
    out = {"name": os.path.basename(os.path.normpath(run_dir))}
    for name, key in FILES.items():
        path = heldout_em if key == "heldout_em" and heldout_em else os.path.join(run_dir, name)
        if not os.path.exists(path):
            continue
        text = read_text(path)
        lines = text.splitlines(keepends=True)
        try:
            value = [json.loads(ln) for ln in lines] if key == "metrics" else json.loads(text)
            same = dump(key, value) == text
        except ValueError:
            same = False
        if not same:
            raise SystemExit(f"{path}: not as json.dump wrote it (a torn last line, or edited by "
                             "hand?), so its pack would not restore it byte for byte; repair "
                             "the file, then pack again")
        out[key] = value
    if "config" not in out:
        raise SystemExit(f"{run_dir}: no config.json; a run directory holds one")
    return out


def write(path, objects):
    """Write ``objects`` sorted by name, under another name, then renamed; mtime 0 in the gzip
    header, so that the same records give the same bytes (git sees no change)."""
    with open(f"{path}.tmp", "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as z:
            for obj in sorted(objects, key=lambda o: o["name"]):
                z.write((json.dumps(obj) + "\n").encode())
    os.replace(f"{path}.tmp", path)


def read(path):
    """Every object of a pack: runs and the folder's other files."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def run_records(path):
    """The runs of a pack, sorted by name, as sorted(glob) listed their directories."""
    return [o for o in read(path) if "config" in o]


def metrics(run, path=""):
    """The run's metrics rows from its last start on: a step lower than the row before it marks
    an attempt logged after an earlier one's rows (code before the clean restart did; the pack
    keeps such a log whole). ``path`` (the pack) names the log in the warning."""
    rows = run["metrics"]
    restarts = [i for i in range(1, len(rows)) if rows[i]["step"] < rows[i - 1]["step"]]
    if restarts:
        print(f"warning: {path}: {run['name']}/metrics.jsonl: the run restarted from the warm-up; "
              f"the {restarts[-1]} rows before its last start are not read", file=sys.stderr)
        rows = rows[restarts[-1]:]
    return rows


def pack(folder, path):
    """Pack every run directory of ``folder``, and its other files, into ``path``; a file no key
    of FILES names stops it, so that nothing is left out unnoticed."""
    objects = []
    for name in sorted(os.listdir(folder)):
        where = os.path.join(folder, name)
        if not os.path.isdir(where):
            objects.append({"name": name, "text": read_text(where)})
            continue
        unknown = sorted(set(os.listdir(where)) - set(FILES))
        if unknown:
            raise SystemExit(f"{where}: {', '.join(unknown)}: not a file a pack holds "
                             f"({', '.join(FILES)}); move it aside, or add it to FILES")
        objects.append(record(where))
    write(path, objects)
    return objects


def add(path, new):
    """Put the run objects ``new`` into the pack at ``path`` (a new pack if there is none), each
    in place of the record of the same name."""
    names = {o["name"] for o in new}
    kept = [o for o in read(path) if o["name"] not in names] if os.path.exists(path) else []
    write(path, kept + list(new))


def unpack(path, folder):
    """Write a pack's run directories (and other files) back into ``folder``."""
    for obj in read(path):
        where = os.path.join(folder, obj["name"])
        if "config" not in obj:
            os.makedirs(folder, exist_ok=True)
            write_text(where, obj["text"])
            continue
        os.makedirs(where, exist_ok=True)
        for name, key in FILES.items():
            if key in obj:
                write_text(os.path.join(where, name), dump(key, obj[key]))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        raise SystemExit("usage: python lab/packs.py pack FOLDER PACK | unpack PACK FOLDER")
    if sys.argv[1] == "pack":
        print(f"{len(pack(sys.argv[2], sys.argv[3]))} objects packed into {sys.argv[3]}")
    else:
        unpack(sys.argv[2], sys.argv[3])
        print(f"{sys.argv[2]} unpacked into {sys.argv[3]}")
