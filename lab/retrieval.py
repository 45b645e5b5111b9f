"""BM25 for a big corpus: the core's Okapi BM25 (search_env.BM25) as a postings index, so that a
million passages fit in memory and a query costs only the postings of its words.

* ``PostingsBM25`` scores with the core's formula (same tokeniser, k1, b, Lucene's idf) and
  ranks as it does (positive scores only, ties to the lower index).
* ``Corpus`` is a World searched through it: ``search(query, k)`` returns ``Doc`` lists, as
  the core's World does. lab/real_data.py reads CORPUS into one; lab/bm25_scale.py measures it.
"""
import array
from functools import cached_property

import numpy as np

import search_env
from search_env import tokenize


class PostingsBM25:
    """Okapi BM25 over a list of texts. Postings are stored term-major, so a query costs one
    ``bincount`` over the postings of its terms, whatever the corpus size."""

    def __init__(self, texts, k1=1.2, b=0.75):
        self.vocab, term_ids, lengths = {}, array.array("q"), array.array("q")
        for text in texts:   # one passage at a time: a million passages never exist as token lists
            n = len(term_ids)
            term_ids.extend(self.vocab.setdefault(w, len(self.vocab)) for w in tokenize(text))
            lengths.append(len(term_ids) - n)
        self.n_docs = len(lengths)
        doc_ids = np.repeat(np.arange(self.n_docs), np.frombuffer(lengths, dtype=np.int64))
        lengths = np.frombuffer(lengths, dtype=np.int64).astype(np.float64)
        term_ids = np.frombuffer(term_ids, dtype=np.int64)
        # One key per (term, doc) pair; unique() sorts by term and counts term frequencies.
        keys, tf = np.unique(term_ids * self.n_docs + doc_ids, return_counts=True)
        del term_ids, doc_ids
        term, doc = keys // self.n_docs, keys % self.n_docs
        df = np.bincount(term, minlength=len(self.vocab))
        idf = np.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))  # Lucene's, never negative
        norm = k1 * (1.0 - b + b * lengths[doc] / max(lengths.mean() if self.n_docs else 0.0, 1e-9))
        self.post_doc = doc
        self.post_weight = idf[term] * tf * (k1 + 1.0) / (tf + norm)
        self.offsets = np.searchsorted(term, np.arange(len(self.vocab) + 1))

    def scores(self, query):
        """BM25 score of every document for the query, shape [n_docs]. A word the query repeats
        counts each time, as in the core."""
        ids = [self.vocab[w] for w in tokenize(query) if w in self.vocab]
        if not ids:
            return np.zeros(self.n_docs)
        sl = [slice(self.offsets[i], self.offsets[i + 1]) for i in ids]
        return np.bincount(np.concatenate([self.post_doc[s] for s in sl]),
                           weights=np.concatenate([self.post_weight[s] for s in sl]),
                           minlength=self.n_docs)

    def search_indices(self, query, k=3):
        """Indices of the top-k documents with a positive score; ties go to the lower index.
        The k-th best score comes from a partition, O(n_docs), and only the documents scoring
        at least that much are sorted: a query never sorts the whole corpus."""
        s = self.scores(query)
        kth = np.partition(s, len(s) - k)[len(s) - k] if k < len(s) else 0.0
        candidates = np.flatnonzero(s >= max(kth, np.finfo(np.float64).tiny))   # ascending index
        return [int(i) for i in candidates[np.argsort(-s[candidates], kind="stable")][:k]]

    def search(self, query, k=3):
        """(doc index, score) pairs of the top-k hits, best first, as search_env.BM25.search."""
        s = self.scores(query)
        return [(i, float(s[i])) for i in self.search_indices(query, k)]


class Corpus(search_env.World):
    """A World over a big corpus: the core's ``search(query, k)``, through ``PostingsBM25``."""

    @cached_property
    def bm25(self):
        """Built on the first search, as the core's."""
        return PostingsBM25([d.title + " " + d.text for d in self.docs])
