"""BM25 retrieval over a corpus, the agent protocol, the search environment and the exact-match reward.

Everything the agent interacts with lives here; the synthetic world it is trained on, its
demonstrator and its oracle are in toy_world.py.

* ``Doc``, ``Question`` and ``World`` hold a corpus and its questions.
* ``BM25`` is Okapi BM25 in numpy (postings lists, one ``bincount`` per query).
* ``parse_action`` / ``format_information`` / ``SearchEnv`` implement the Search-R1 protocol:
  the model writes ``<search> q </search>`` and receives ``<information> ... </information>``,
  until it writes ``<answer> a </answer>``.
* ``exact_match`` is the reward (SQuAD normalisation).
* ``load_jsonl`` reads a real corpus and question file into the same ``World``.
"""
import json
import re
import string
import unicodedata
from dataclasses import dataclass, field

import numpy as np

# ----------------------------------------------------------------------------- protocol
THINK, THINK_END = "<think>", "</think>"
SEARCH, SEARCH_END = "<search>", "</search>"
INFO, INFO_END = "<information>", "</information>"
ANSWER, ANSWER_END = "<answer>", "</answer>"
TAGS = (THINK, THINK_END, SEARCH, SEARCH_END, INFO, INFO_END, ANSWER, ANSWER_END)
MAX_ACTION_CHARS = 120  # a query or answer longer than this is a runaway generation, not an action

INSTRUCTION = "answer the question. use <search> query </search> to search, then <answer> answer </answer>."


# ----------------------------------------------------------------------------- normalisation
_PUNCT = set(string.punctuation)


def normalize_answer(text):
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, squeeze spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
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
        self.bm25 = BM25([d.title + " " + d.text for d in self.docs])

    def split(self, name):
        return [q for q in self.questions if q.split == name]

    def search(self, query, k=3):
        """Doc objects of the top-k BM25 hits for a query."""
        return [self.docs[i] for i in self.bm25.search_indices(query, k)]

    def evidence_docs(self, question):
        return [self.doc_by_id[i] for i in question.evidence]


# ----------------------------------------------------------------------------- BM25
class BM25:
    """Okapi BM25 over a list of texts. Postings are stored term-major, so a query costs one
    ``bincount`` over the postings of its terms, whatever the corpus size."""

    def __init__(self, texts, k1=1.2, b=0.75):
        docs = [tokenize(t) for t in texts]
        self.n_docs = len(docs)
        self.vocab = {}
        term_ids = [self.vocab.setdefault(w, len(self.vocab)) for d in docs for w in d]
        doc_ids = np.repeat(np.arange(self.n_docs), [len(d) for d in docs])
        lengths = np.array([len(d) for d in docs], dtype=np.float64)
        # One key per (term, doc) pair; unique() sorts by term and counts term frequencies.
        keys, tf = np.unique(np.asarray(term_ids, dtype=np.int64) * self.n_docs + doc_ids,
                             return_counts=True)
        term, doc = keys // self.n_docs, keys % self.n_docs
        df = np.bincount(term, minlength=len(self.vocab))
        idf = np.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))  # Lucene's, never negative
        norm = k1 * (1.0 - b + b * lengths[doc] / max(lengths.mean(), 1e-9))
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
        """Indices of the top-k documents with a positive score; ties go to the lower index."""
        s = self.scores(query)
        top = np.argsort(-s, kind="stable")[:k]
        return [int(i) for i in top if s[i] > 0]

    def search(self, query, k=3):
        """(doc index, score) pairs of the top-k hits, best first."""
        s = self.scores(query)
        return [(i, float(s[i])) for i in self.search_indices(query, k)]


# ----------------------------------------------------------------------------- the protocol
@dataclass
class Action:
    kind: str      # "search" | "answer" | "invalid"
    content: str   # the query or the answer; for invalid turns, why


def _invalid(why):
    return Action("invalid", why)


def parse_action(turn_text):
    """Parse one generated turn, which ends at the first ``</search>`` or ``</answer>``.

    Valid: optional free text (thinking) then exactly one ``<search> q </search>`` or
    ``<answer> a </answer>`` at the very end. Anything else is ``invalid``; this never raises.
    A turn must be valid Unicode (no lone surrogates, which no file or terminal can encode)
    without control characters (tab and newline are allowed in the thinking, not in the action).
    """
    if not isinstance(turn_text, str):
        return _invalid("not text")
    try:
        turn_text.encode("utf-8")
    except UnicodeEncodeError as e:
        return _invalid(f"not valid Unicode (lone surrogate U+{ord(turn_text[e.start]):04X})")
    bad = next((ch for ch in turn_text if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r"), None)
    if bad is not None:
        return _invalid(f"control character U+{ord(bad):04X}")
    text = turn_text.strip()
    counts = {t: text.count(t) for t in TAGS}
    if counts[INFO] or counts[INFO_END]:
        return _invalid("the model may not write <information>")
    n_search = counts[SEARCH] + counts[SEARCH_END]
    n_answer = counts[ANSWER] + counts[ANSWER_END]
    if n_search and n_answer:
        return _invalid("both a search and an answer")
    if n_search == 0 and n_answer == 0:
        return _invalid("no action tag")
    kind, open_tag, close_tag = (("search", SEARCH, SEARCH_END) if n_search
                                 else ("answer", ANSWER, ANSWER_END))
    if counts[open_tag] != 1 or counts[close_tag] != 1:
        return _invalid("unclosed or repeated tag")
    if not text.endswith(close_tag):
        return _invalid("text after the closing tag")
    start = text.index(open_tag)
    content = text[start + len(open_tag):-len(close_tag)]
    if any(t in content for t in TAGS):
        return _invalid("nested tag")
    if any(ch in "\t\n\r" for ch in content):
        return _invalid("tab or line break inside the " + kind)
    content = content.strip()
    if not content:
        return _invalid("empty " + kind)
    if len(content) > MAX_ACTION_CHARS:
        return _invalid(kind + " too long")
    before = text[:start]
    if counts[THINK] != counts[THINK_END] or before.count(THINK_END) != counts[THINK_END]:
        return _invalid("unbalanced <think>")
    return Action(kind, content)


def format_information(docs):
    """The exact text block the environment returns for a search. The EviSD teacher formats
    its gold evidence with this same function, so both look alike to the model."""
    if not docs:
        return f"{INFO} no results. {INFO_END}"
    # "title: text", never "[title]": byte-level BPE spells a word differently right after
    # punctuation than after a space, and the title must look like the query that found it.
    body = " ".join(f"{d.title}: {d.text}" for d in docs)
    return f"{INFO} {body} {INFO_END}"


INVALID_OBSERVATION = f"{INFO} invalid turn. use {SEARCH} query {SEARCH_END} or {ANSWER} answer {ANSWER_END}. {INFO_END}"


@dataclass
class StepResult:
    observation: str   # text to append to the transcript ("" when the episode is done)
    done: bool
    reward: float
    action: Action


class SearchEnv:
    """One multi-turn episode for one question: each generated turn in, an observation out."""

    def __init__(self, world, question, max_turns=4, top_k=3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.world, self.question = world, question
        self.max_turns, self.top_k = max_turns, top_k
        self.turns, self.done, self.reward, self.answer = 0, False, 0.0, None

    def prompt(self):
        """The plain-text prompt (model.render_prompt wraps it in a chat template if any)."""
        return f"{INSTRUCTION}\nquestion: {self.question.question}\n"

    def step(self, turn_text):
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
            obs = format_information(self.world.search(action.content, self.top_k))
        else:
            obs = INVALID_OBSERVATION
        return StepResult(obs, False, 0.0, action)


# ----------------------------------------------------------------------------- real data
def _read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None


def load_jsonl(corpus_path, questions_path):
    """A World from a real corpus and question file (Search-R1 / FlashRAG style JSONL).

    corpus lines: ``{"id", "title", "text"}`` or ``{"id", "contents"}`` (first line = title);
    question lines: ``question``, ``golden_answers`` or ``answers``, optional
    ``supporting_facts``/``evidence`` (doc titles or ids), optional ``split`` and ``id``.
    """
    docs = []
    for n, row in _read_jsonl(corpus_path):
        if "id" not in row:
            raise ValueError(f"{corpus_path}:{n}: missing field 'id'")
        if "contents" in row:
            title, _, text = row["contents"].partition("\n")
            docs.append(Doc(str(row["id"]), title.strip().strip('"'), text.strip()))
        elif "title" in row and "text" in row:
            docs.append(Doc(str(row["id"]), row["title"], row["text"]))
        else:
            raise ValueError(f"{corpus_path}:{n}: missing field 'contents' (or 'title' and 'text')")
    by_id = {d.id: d.id for d in docs}
    by_title = {d.title: d.id for d in docs}
    questions = []
    for n, row in _read_jsonl(questions_path):
        if "question" not in row:
            raise ValueError(f"{questions_path}:{n}: missing field 'question'")
        answers = row.get("golden_answers", row.get("answers"))
        if not answers:
            raise ValueError(f"{questions_path}:{n}: missing field 'golden_answers' (or 'answers')")
        answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
        evidence = []
        for ref in row.get("supporting_facts", row.get("evidence", [])):
            ref = ref[0] if isinstance(ref, list) else str(ref)  # HotpotQA: [title, sentence]
            doc = by_id.get(ref) or by_title.get(ref)
            if doc is None:
                raise ValueError(f"{questions_path}:{n}: evidence {ref!r} is no doc id or title in {corpus_path}")
            if doc not in evidence:
                evidence.append(doc)
        questions.append(Question(str(row.get("id", f"q{n}")), row["question"], answers, evidence,
                                  max(1, len(evidence)), row.get("split", "test")))
    return World(docs, questions)
