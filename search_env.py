"""What the agent interacts with: a corpus and its questions (``World``), BM25, the Search-R1
protocol (the model writes ``<search> q </search>``, receives ``<information> ...
</information>``, ends with ``<answer> a </answer>``), the env, and its reward.

``exact_match`` is what evaluation reports; ``outcome_reward`` is what training optimises (exact
match unless edited). A retriever is anything with ``search(query, k)`` returning ``Doc`` lists: a
``World``, or one of the lab's (lab/real_data.py); ``SearchEnv`` never asks which."""
import math
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

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
INVALID_OBSERVATION = (f"{INFO} invalid turn. use {SEARCH} query {SEARCH_END} "
                       f"or {ANSWER} answer {ANSWER_END}. {INFO_END}")


# ----------------------------------------------------------------------------- normalisation
def normalize_answer(text):
    """SQuAD normalisation: lower-case, no punctuation, no a/an/the, single spaces."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def tokenize(text):
    """The one tokeniser shared by BM25 and the answer check, so both see the same words."""
    return normalize_answer(text).split()


def exact_match(prediction, answers):
    """1.0 if the prediction, normalised, is one of the accepted answers, normalised; else 0.0."""
    return float(prediction is not None
                 and normalize_answer(prediction) in {normalize_answer(a) for a in answers})


def outcome_reward(answer, question, turns):
    """The training reward of a finished episode (``answer``: None if it gave none, ``turns``:
    the turns it took). Change it here: evaluation still reports exact match."""
    return exact_match(answer, question.answers)


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
        return [self.docs[i] for i, _ in self.bm25.search(query, k)]

    def retriever(self, question):
        """What serves a question's searches: here the whole corpus (the lab's worlds differ)."""
        return self

    def evidence_docs(self, question):
        """The gold evidence EviSD's teacher reads before a search action."""
        return [self.doc_by_id[i] for i in question.evidence]


class RetrieverError(SystemExit):
    """A retriever failed for good (a server stopped answering): train.py saves, then stops."""


# ----------------------------------------------------------------------------- BM25
class BM25:
    """Okapi BM25 over a list of texts, read straight off the formula. A query looks at every
    document, which a toy world's few hundred afford; lab/retrieval.py has the postings index a
    million passages need."""

    def __init__(self, texts, k1=1.2, b=0.75):
        self.k1, self.b = k1, b
        self.tf = [Counter(tokenize(text)) for text in texts]    # term -> count, per document
        self.length = [sum(tf.values()) for tf in self.tf]
        self.avg_length = max(sum(self.length) / len(self.length) if texts else 0.0, 1e-9)
        n, df = len(self.tf), Counter(w for tf in self.tf for w in tf)
        # Lucene's idf: never negative, even for a term in most documents
        self.idf = {w: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def scores(self, query):
        """BM25 score of every document for the query [n_docs]; a repeated word counts twice."""
        k1, b = self.k1, self.b
        scores = [0.0] * len(self.tf)
        for w in tokenize(query):
            for i, tf in enumerate(self.tf):
                if w in tf:
                    norm = k1 * (1.0 - b + b * self.length[i] / self.avg_length)
                    scores[i] += self.idf[w] * tf[w] * (k1 + 1.0) / (tf[w] + norm)
        return scores

    def search(self, query, k=3):
        """(doc index, score) of the top k scoring above 0, best first, ties to the lower index."""
        s = self.scores(query)
        best = sorted((i for i in range(len(s)) if s[i] > 0), key=lambda i: -s[i])
        return [(i, s[i]) for i in best[:k]]


# ----------------------------------------------------------------------------- the protocol
@dataclass
class Action:
    kind: str          # "search" | "answer" | "invalid"
    content: str       # the query or the answer; for invalid turns, why
    opening: int = -1  # a valid action: where its opening tag starts in the turn's text
    closing: int = -1  # ... and where its closing tag starts (the content lies between)


def parse_action(turn_text):
    """Parse one generated turn, which ends at the first ``</search>`` or ``</answer>``: valid is
    optional thinking, then one ``<search> q </search>`` or ``<answer> a </answer>`` at the very
    end. Anything else is ``invalid``, with the reason why; this never raises."""
    if not isinstance(turn_text, str):
        return Action("invalid", "not text")
    # Whatever prints or saves a turn must not break: no lone surrogate or control character.
    bad = next((ch for ch in turn_text
                if unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\t\n\r"), None)
    if bad is not None:
        return Action("invalid", f"unprintable character U+{ord(bad):04X}")
    text = turn_text.strip()
    counts = {t: text.count(t) for t in TAGS}
    n_search, n_answer = counts[SEARCH] + counts[SEARCH_END], counts[ANSWER] + counts[ANSWER_END]
    kind, open_tag, close_tag = (("search", SEARCH, SEARCH_END) if n_search
                                 else ("answer", ANSWER, ANSWER_END))
    start = text.find(open_tag)
    body = text[start + len(open_tag):-len(close_tag)]
    # The rules of a valid turn, each with what breaking it means, checked in this order.
    rules = [(not counts[INFO] and not counts[INFO_END], "the model may not write <information>"),
             (bool(n_search) != bool(n_answer), "no action tag, or both kinds"),
             (counts[open_tag] == counts[close_tag] == 1, "unclosed or repeated tag"),
             (text.endswith(close_tag), "text after the closing tag"),
             (not any(t in body for t in TAGS + ("\t", "\n", "\r")),
              f"a tag, tab or line break inside the {kind}"),
             (0 < len(body.strip()) <= MAX_ACTION_CHARS, f"empty or runaway {kind}"),
             (counts[THINK] == counts[THINK_END] == text[:start].count(THINK_END),
              "unbalanced <think>")]
    if broken := next((why for ok, why in rules if not ok), None):
        return Action("invalid", broken)
    # offsets in turn_text itself, which the rollout maps to tokens: text is it, stripped
    lead = len(turn_text) - len(turn_text.lstrip())
    return Action(kind, body.strip(), lead + start, lead + len(text) - len(close_tag))


def stop_end(text):
    """Where the first stop string in ``text`` ends (the index after it), or None."""
    return min((text.find(s) + len(s) for s in STOP_STRINGS if s in text), default=None)


def format_information(docs):
    """The block a search returns; the teacher's evidence goes through it too: both look alike."""
    if not docs:
        return f"{INFO} no results. {INFO_END}"
    # "title: text", never "[title]": byte-level BPE spells a word differently right after
    # punctuation than after a space, and the title must look like the query that found it.
    body = " ".join(f"{d.title}: {d.text}" if d.title else d.text for d in docs)
    return f"{INFO} {body} {INFO_END}"


@dataclass
class StepResult:
    observation: str   # text to append to the transcript ("" when the episode is done)
    done: bool
    reward: float
    action: Action


class SearchEnv:
    """One episode of one question: each generated turn in, an observation out."""

    def __init__(self, retriever, question, max_turns=4, top_k=3):
        self.retriever, self.question = retriever, question
        self.max_turns, self.top_k = max_turns, top_k
        self.turns, self.done, self.reward, self.em, self.answer = 0, False, 0.0, 0.0, None

    def step(self, turn_text):
        """One turn: a search is run, an answer ends the episode and is scored."""
        if self.done:
            raise RuntimeError("step() called on a finished episode")
        self.turns += 1
        action = parse_action(turn_text)
        self.answer = action.content if action.kind == "answer" else None
        self.done = action.kind == "answer" or self.turns >= self.max_turns
        if self.done:                                  # scored, answered or not
            self.reward = outcome_reward(self.answer, self.question, self.turns)
            self.em = exact_match(self.answer, self.question.answers)
            return StepResult("", True, self.reward, action)
        obs = (format_information(self.retriever.search(action.content, self.top_k))
               if action.kind == "search" else INVALID_OBSERVATION)
        return StepResult(obs, False, 0.0, action)


def episodes(world, questions, group_size=1, max_turns=4, top_k=3):
    """One SearchEnv per episode: each question ``group_size`` times in a row."""
    return [SearchEnv(world.retriever(q), q, max_turns, top_k)
            for q in questions for _ in range(group_size)]
