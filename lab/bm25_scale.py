"""How far in-memory BM25 (lab/retrieval.py's PostingsBM25) scales: index build time, memory
and ms per query on synthetic passages shaped like wiki-18's (a two-word title and 100 words,
words drawn from a Zipf law over a 300k-word vocabulary, so common words have posting lists as
long as the corpus).

    nice -n 19 python lab/bm25_scale.py 100000  # one size per process: its peak memory is its own
    nice -n 19 python lab/bm25_scale.py 1000000

Prints one JSON line: build seconds, the process's memory before the build and its peak above
that (ru_maxrss), the index's arrays, and the median and 95th-percentile ms of top-3 searches
for 200 queries of 3-8 words.
"""
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab.retrieval import PostingsBM25  # noqa: E402

VOCAB, WORDS, ZIPF = 300_000, 100, 1.07


def passages(n, rng):
    """n passages, generated in chunks so that making them peaks below building the index."""
    p = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF
    p /= p.sum()
    vocab = [f"w{r}x" for r in range(VOCAB)]
    texts = []
    for start in range(0, n, 50_000):
        m = min(50_000, n - start)
        ids = rng.choice(VOCAB, size=(m, WORDS + 2), p=p)
        texts += [" ".join(vocab[i] for i in row) for row in ids]
    return texts, vocab, p


def main(n):
    rng = np.random.default_rng(0)
    texts, vocab, p = passages(n, rng)
    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # GiB (Linux: KiB)
    before = rss()
    t0 = time.perf_counter()
    bm25 = PostingsBM25(texts)
    build_s = time.perf_counter() - t0
    arrays = sum(a.nbytes for a in (bm25.post_doc, bm25.post_weight, bm25.offsets)) / 2**30
    queries = [" ".join(vocab[i] for i in rng.choice(VOCAB, size=rng.integers(3, 9), p=p))
               for _ in range(200)]
    ms = []
    for q in queries:
        t0 = time.perf_counter()
        bm25.search_indices(q, 3)
        ms.append(1000 * (time.perf_counter() - t0))
    print(json.dumps({"passages": n, "postings": len(bm25.post_doc), "vocab": len(bm25.vocab),
                      "build_s": round(build_s, 1), "rss_before_build_gib": round(before, 2),
                      "peak_above_that_gib": round(rss() - before, 2),
                      "index_arrays_gib": round(arrays, 2),
                      "ms_per_query_median": round(float(np.median(ms)), 1),
                      "ms_per_query_p95": round(float(np.percentile(ms, 95)), 1)}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
