"""BM25 retrieval over a corpus, the agent protocol, the search environment and the exact-match
reward.

Everything the agent interacts with lives here; the synthetic world it is trained on, its
demonstrator and its oracle are in toy_world.py.

* ``Doc``, ``Question`` and ``World`` hold a corpus and its questions.
* ``BM25`` is Okapi BM25 in numpy (postings lists, one ``bincount`` per query).
* ``parse_action`` / ``format_information`` / ``SearchEnv`` implement the Search-R1 protocol:
  the model writes ``<search> q </search>`` and receives ``<information> ... </information>``,
  until it writes ``<answer> a </answer>``.
* ``exact_match`` is the reward (SQuAD normalisation); ``f1_score`` is HotpotQA's answer F1.

A retriever is anything with ``search(query, k)`` and ``search_batch(queries, k)`` returning
``Doc`` lists: a ``World`` (BM25 over its corpus), or one of lab/real_data.py's (a question's own
paragraphs, Search-R1's retrieval server). ``SearchEnv`` is given one and never asks which;
``episodes`` makes the envs of a batch.
"""
import array
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

# ----------------------------------------------------------------------------- protocol
THINK, THINK_END = "<think>", "</think>"
SEARCH, SEARCH_END = "<search>", "</search>"
INFO, INFO_END = "<information>", "</information>"
ANSWER, ANSWER_END = "<answer>", "</answer>"
TAGS = (THINK, THINK_END, SEARCH, SEARCH_END, INFO, INFO_END, ANSWER, ANSWER_END)
STOP_STRINGS = (SEARCH_END, ANSWER_END)   # a generated turn ends at the first of these
MAX_ACTION_CHARS = 120  # a query or answer longer than this is a runaway generation, not an action

INSTRUCTION = ("answer the question. use <search> query </search> to search, "
               "then <answer> answer </answer>.")


# ----------------------------------------------------------------------------- normalisation
_DROP_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text):
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, squeeze
    spaces."""
    # one C call: BM25 tokenises a million passages with it
    text = text.lower().translate(_DROP_PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def tokenize(text):
    """The one tokeniser shared by BM25 and the answer check, so both see the same words."""
    return normalize_answer(text).split()


def exact_match(prediction, answers):
    """1.0 if the normalised prediction equals any normalised accepted answer, else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def f1_score(prediction, answers):
    """HotpotQA's answer F1 (SQuAD's token F1; yes, no and noanswer count only when they match
    exactly), the best over the accepted answers; 0 without an answer."""
    def f1(pred, gold):
        p, g = normalize_answer(pred), normalize_answer(gold)
        if p != g and {p, g} & {"yes", "no", "noanswer"}:
            return 0.0
        same = sum((Counter(p.split()) & Counter(g.split())).values())
        return 0.0 if same == 0 else 2 * same / (len(p.split()) + len(g.split()))
    return 0.0 if prediction is None else max(f1(prediction, a) for a in answers)


# ----------------------------------------------------------------------------- data types
@dataclass
class Doc:
    id: str
    title: str
    text: str


@dataclass
class Question:
    qid: str
    question: str
    answers: list          # accepted answer strings
    evidence: list         # doc ids of the supporting documents, one per hop, in hop order
    hops: int
    split: str = "train"
    # Synthetic worlds only: what an expert searches at each hop and the fact sentence it reads.
    hop_queries: list = field(default_factory=list)
    hop_facts: list = field(default_factory=list)


@dataclass
class World:
    docs: list
    questions: list
    seed: int = None

    def __post_init__(self):
        self.doc_by_id = {d.id: d for d in self.docs}
        self.doc_by_title = {d.title: d for d in self.docs}

    @cached_property
    def bm25(self):
        """Built on the first search: a world whose questions search elsewhere never builds it."""
        return BM25([d.title + " " + d.text for d in self.docs])

    def split(self, name):
        return [q for q in self.questions if q.split == name]

    def search(self, query, k=3):
        """Doc objects of the top-k BM25 hits for a query."""
        return [self.docs[i] for i in self.bm25.search_indices(query, k)]

    def search_batch(self, queries, k=3):
        return [self.search(q, k) for q in queries]

    def retriever(self, question):
        """What serves a question's searches: here the whole corpus. lab/real_data.py's worlds
        give a HotpotQA question its own paragraphs, or send every search to a retrieval server."""
        return self

    def evidence_docs(self, question):
        """The gold evidence EviSD's teacher reads before a search action."""
        return [self.doc_by_id[i] for i in question.evidence]

    def oracle_labels(self, question, turns, top_k=3):
        """The oracle's grade of each generated turn (toy_world.ToyWorld has one); None: no
        oracle."""
        return None


class RetrieverError(SystemExit):
    """A retriever that failed for good (a retrieval server that stopped answering): train.py
    saves a checkpoint, then stops with this one-line message."""


# ----------------------------------------------------------------------------- BM25
class BM25:
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
        """BM25 score of every document for the query, shape [n_docs]."""
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
        """(doc index, score) pairs of the top-k hits, best first."""
        s = self.scores(query)
        return [(i, float(s[i])) for i in self.search_indices(query, k)]


# ----------------------------------------------------------------------------- the protocol
@dataclass
class Action:
    kind: str          # "search" | "answer" | "invalid"
    content: str       # the query or the answer; for invalid turns, why
    opening: int = -1  # a valid action: where its opening tag starts in the turn's text
    closing: int = -1  # ... and where its closing tag starts (the content lies between)


def parse_action(turn_text):
    """Parse one generated turn, which ends at the first ``</search>`` or ``</answer>``.

    Valid: optional free text (thinking) then exactly one ``<search> q </search>`` or
    ``<answer> a </answer>`` at the very end. Anything else is ``invalid``; this never raises.
    A turn must be valid Unicode (no lone surrogates, which no file or terminal can encode)
    without control characters (tab and newline are allowed in the thinking, not in the action).
    """
    if not isinstance(turn_text, str):
        return Action("invalid", "not text")
    try:
        turn_text.encode("utf-8")
    except UnicodeEncodeError as e:
        surrogate = ord(turn_text[e.start])
        return Action("invalid", f"not valid Unicode (lone surrogate U+{surrogate:04X})")
    bad = next((ch for ch in turn_text
                if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r"), None)
    if bad is not None:
        return Action("invalid", f"control character U+{ord(bad):04X}")
    text = turn_text.strip()
    counts = {t: text.count(t) for t in TAGS}
    if counts[INFO] or counts[INFO_END]:
        return Action("invalid", "the model may not write <information>")
    n_search = counts[SEARCH] + counts[SEARCH_END]
    n_answer = counts[ANSWER] + counts[ANSWER_END]
    if n_search and n_answer:
        return Action("invalid", "both a search and an answer")
    if n_search == 0 and n_answer == 0:
        return Action("invalid", "no action tag")
    kind, open_tag, close_tag = (("search", SEARCH, SEARCH_END) if n_search
                                 else ("answer", ANSWER, ANSWER_END))
    if counts[open_tag] != 1 or counts[close_tag] != 1:
        return Action("invalid", "unclosed or repeated tag")
    if not text.endswith(close_tag):
        return Action("invalid", "text after the closing tag")
    start = text.index(open_tag)
    body = text[start + len(open_tag):-len(close_tag)]
    if any(t in body for t in TAGS):
        return Action("invalid", "nested tag")
    if any(ch in "\t\n\r" for ch in body):
        return Action("invalid", "tab or line break inside the " + kind)
    content = body.strip()
    if not content:
        return Action("invalid", "empty " + kind)
    if len(content) > MAX_ACTION_CHARS:
        return Action("invalid", kind + " too long")
    before = text[:start]
    if counts[THINK] != counts[THINK_END] or before.count(THINK_END) != counts[THINK_END]:
        return Action("invalid", "unbalanced <think>")
    # offsets in turn_text itself, which the rollout maps to tokens: text is it, stripped
    lead = len(turn_text) - len(turn_text.lstrip())
    return Action(kind, content, lead + start, lead + len(text) - len(close_tag))


def stop_end(text):
    """Where the first stop string in ``text`` ends (the index after it), or None."""
    ends = [text.find(s) + len(s) for s in STOP_STRINGS if s in text]
    return min(ends) if ends else None


def format_information(docs):
    """The exact text block the environment returns for a search. The EviSD teacher formats
    its gold evidence with this same function, so both look alike to the model."""
    if not docs:
        return f"{INFO} no results. {INFO_END}"
    # "title: text", never "[title]": byte-level BPE spells a word differently right after
    # punctuation than after a space, and the title must look like the query that found it.
    body = " ".join(f"{d.title}: {d.text}" if d.title else d.text for d in docs)
    return f"{INFO} {body} {INFO_END}"


INVALID_OBSERVATION = (f"{INFO} invalid turn. use {SEARCH} query {SEARCH_END} "
                       f"or {ANSWER} answer {ANSWER_END}. {INFO_END}")


@dataclass
class StepResult:
    observation: str   # text to append to the transcript ("" when the episode is done)
    done: bool
    reward: float
    action: Action


class SearchEnv:
    """One multi-turn episode for one question: each generated turn in, an observation out.
    ``retriever`` answers its searches (a World, or see the module docstring)."""

    def __init__(self, retriever, question, max_turns=4, top_k=3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.retriever, self.question = retriever, question
        self.max_turns, self.top_k = max_turns, top_k
        self.turns, self.done, self.reward, self.answer = 0, False, 0.0, None

    def step(self, turn_text, retrieved=None):
        """One turn. ``retrieved``: its search's documents when step_all fetched them already."""
        if self.done:
            raise RuntimeError("step() called on a finished episode")
        self.turns += 1
        action = parse_action(turn_text)
        if action.kind == "answer":
            self.done, self.answer = True, action.content
            self.reward = exact_match(action.content, self.question.answers)
            return StepResult("", True, self.reward, action)
        if self.turns >= self.max_turns:
            self.done = True
            return StepResult("", True, 0.0, action)
        if action.kind == "search":
            docs = (self.retriever.search(action.content, self.top_k) if retrieved is None
                    else retrieved)
            obs = format_information(docs)
        else:
            obs = INVALID_OBSERVATION
        return StepResult(obs, False, 0.0, action)


def episodes(world, questions, group_size=1, max_turns=4, top_k=3):
    """One SearchEnv per episode: each question ``group_size`` times in a row, searching the
    retriever its world gives it. rollout.rollout plays them as one batch."""
    return [SearchEnv(world.retriever(q), q, max_turns, top_k)
            for q in questions for _ in range(group_size)]


def step_all(envs, turn_texts):
    """``env.step(text)`` for every env and its turn, with all of the turn's searches that go to
    one retriever sent in one ``search_batch`` call: one request per turn to a retrieval server,
    however many episodes are playing. A search on an episode's last turn is never run."""
    batches = {}                       # (retriever, top_k) -> [(env index, query)]
    for i, (env, text) in enumerate(zip(envs, turn_texts)):
        action = parse_action(text)
        if action.kind == "search" and not env.done and env.turns + 1 < env.max_turns:
            batches.setdefault((id(env.retriever), env.top_k), []).append((i, action.content))
    retrieved = {}
    for items in batches.values():
        env = envs[items[0][0]]
        retrieved.update(zip([i for i, _ in items],
                             env.retriever.search_batch([q for _, q in items], env.top_k)))
    return [env.step(text, retrieved.get(i)) for i, (env, text) in enumerate(zip(envs, turn_texts))]
