"""How much code one RL step reaches: run a short train.py and record every named project
function called while ``train.rl_step`` is running (an exact trace with sys.setprofile, not a
profile's caller graph, which joins paths through shared wrappers such as torch.no_grad's),
counted file by file. Lambdas and comprehensions are not counted.

    python lab/call_graph.py                     # --SFT_STEPS=0 --RL_STEPS=2, in a temp dir
    python lab/call_graph.py --METHOD=grpo       # any train.py override
    python lab/call_graph.py --SFT_STEPS=750 --SFT_DIR=out/sft   # a warmed-up model (cached):
                                                 # its searches are real, the teacher scores them
"""
import os
import sys
import tempfile
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import train  # noqa: E402


def trace(run, start="rl_step"):
    """The project functions called inside ``start``'s calls while ``run()`` runs:
    {(file, first line, name)}."""
    found, depth = set(), [0]

    def profiler(frame, event, arg):
        code = frame.f_code
        if event not in ("call", "return") or not code.co_filename.startswith(ROOT):
            return
        is_start = code.co_name == start and code.co_filename.endswith("train.py")
        if event == "call":
            depth[0] += is_start
            if depth[0] and not code.co_name.startswith("<"):
                found.add((os.path.relpath(code.co_filename, ROOT), code.co_firstlineno,
                           code.co_name))
        elif is_start:
            depth[0] -= 1

    sys.setprofile(profiler)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def main(argv):
    with tempfile.TemporaryDirectory() as out:
        # later arguments win: argv may ask for a warm-up, cached where it says
        args = ["--SFT_STEPS=0", "--RL_STEPS=2", "--EVAL_EVERY=0", f"--OUT_DIR={out}/run",
                f"--SFT_DIR={out}/sft"] + argv
        functions = trace(lambda: train.main(args))
    files = Counter(f for f, _, _ in functions)
    core = {name for name in files if "/" not in name}
    print(f"rl_step reaches {len(functions)} named project functions in {len(files)} files "
          f"({len(core)} of them core files, at the top level):")
    for name, n in files.most_common():
        names = sorted(f"{fn}:{line}" for f, line, fn in functions if f == name)
        print(f"  {name}: {n} ({', '.join(names)})")


if __name__ == "__main__":
    main(sys.argv[1:])
