"""Export a run as one plain Hugging Face directory: a LoRA run's adapter merged into its base
(W + B A * alpha / r, once, in float32), so that any tool loads it without PEFT or this code; a
full fine-tuning run's weights as they are.

    python lab/export.py out/run out/run-merged     # the run's newest checkpoint, or a ckpt-*
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import model  # noqa: E402
import runs  # noqa: E402


def export(run_dir, out_dir):
    """Write ``run_dir``'s newest checkpoint (or that checkpoint) to ``out_dir``, merged."""
    if os.path.exists(out_dir):
        raise SystemExit(f"{out_dir} exists already: give a new directory")
    policy, tokenizer, cfg, base = runs.load_run(run_dir)
    if model.is_lora(policy):
        print(f"merging the rank-{cfg['LORA_RANK']} adapter into its base {base}")
        policy = policy.merge_and_unload()
    model.save_checkpoint_dir(policy, tokenizer, out_dir)
    print(f"saved {out_dir}: a plain HF directory (AutoModelForCausalLM.from_pretrained)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run directory (train.py's OUT_DIR) or one of its ckpt-*")
    ap.add_argument("out", help="the directory to write (must not exist)")
    args = ap.parse_args()
    export(args.run, args.out)
