"""Probe (session 5): every name word one token. Stuck warm-ups copy a name's first piece and
invent the rest (lab/results/warmup-probes.md); with a 768-token BPE, 170 of the 400 two-syllable name
words (with their leading space) are spelled in 2-3 pieces, and copying those later pieces needs
an induction circuit that forms late. This probe trains the tokenizer with every name word in
its text and a vocabulary of VOCAB (1024 makes all 400 one token each), then runs
warmup_sweep.py as usual; rows go to out/sweep/results.jsonl.

    VOCAB=1024 python lab/results/warmup19/word_tokens.py words-450 --seeds 1,7 --SFT_STEPS=450
"""
import os
import sys

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(DOCS), DOCS]

import model as M  # noqa: E402
import toy_world as tw  # noqa: E402
import warmup_sweep  # noqa: E402

VOCAB = int(os.environ.get("VOCAB", "1024"))
texts, build = M.tokenizer_texts, M.build_tokenizer
M.tokenizer_texts = lambda *a, **k: texts(*a, **k) + [" ".join(a + b for a in tw.SYLLABLES for b in tw.SYLLABLES)]
M.build_tokenizer = lambda t, vocab_size=VOCAB: build(t, vocab_size)
if __name__ == "__main__":
    warmup_sweep.main(sys.argv[1:])
