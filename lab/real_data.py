"""Real questions and real retrieval: HotpotQA, 2WikiMultiHopQA, MuSiQue and Search-R1's files,
searched by BM25 in memory (lab/retrieval.py for a big corpus) or through Search-R1's retrieval
server; the teacher's evidence on real data; dev scores (EM and HotpotQA's answer F1). The
oracle's labels on real data are lab/oracle.py's. docs/real-data.md has the details.
train.py and evaluate.py switch this module on where DATA is not "toy".

A dataset becomes what the toy world is to the rest of the code: a ``RealWorld`` holds a split's
questions, hands ``SearchEnv`` each question's retriever and EviSD's teacher its evidence.
DATA's formats, read as distributed: ``hotpotqa``/``2wiki`` (a JSON list; each question's own
paragraphs are its corpus), ``musique`` (JSONL), ``jsonl`` (Search-R1 / FlashRAG questions over
CORPUS, wiki-18's ``{"id", "contents"}`` lines, or RETRIEVER_URL). EVIDENCE, what the teacher
reads before a search: ``sentences``, the supporting sentences (at most two documents × two
sentences, as EviSD's paper); ``paragraphs``, the whole supporting paragraphs; ``answer_passages``,
those the question retrieves that hold a golden answer; ``answer_only``, none; ``auto``, the
first of sentences, paragraphs and answer_passages that a question has.
"""
import dataclasses
import http.client
import json
import math
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import torch

import evaluate
import model
import search_env
from lab import retrieval
from search_env import Doc, exact_match, normalize_answer

# the train file's first ones (at most a tenth): for choosing settings, never trained on
VALIDATION_QUESTIONS = 500
# per-question BM25 indexes kept at once (a HotpotQA train split has 90k)
OWN_CORPORA_KEPT = 4096
# The retrieval server: a request with no answer in SERVER_TIMEOUT_S, a refused connection or a
# 5xx status is sent again after 2, 4, 8, 16 s; after the last attempt the run saves and stops.
SERVER_TIMEOUT_S = 60.0
SERVER_ATTEMPTS = 5
SERVER_BACKOFF_S = 2.0
# The teacher's evidence before a search (RealWorld.evidence_docs): EVIDENCE's values, and the
# paper's budget for "sentences": at most EVIDENCE_DOCS documents × EVIDENCE_SENTENCES sentences.
EVIDENCE_RULES = ("auto", "sentences", "paragraphs", "answer_passages", "answer_only")
EVIDENCE_DOCS = 2
EVIDENCE_SENTENCES = 2


class DataError(SystemExit):
    """Bad data or data settings, as one line naming the file and line (or the URL and status).
    A SystemExit, so a command line prints that line and no traceback."""


class RetrieverError(DataError, search_env.RetrieverError):
    """The retrieval server failed for good; train.py saves a checkpoint before it stops."""


@dataclass
class RealQuestion(search_env.Question):
    support: list = field(default_factory=list)        # the data's supporting paragraphs (Docs)
    # the teacher's supporting sentences: Docs of at most 2 sentences, at most 2 of them
    sentences: list = field(default_factory=list)
    # the question's own paragraphs (HotpotQA, 2Wiki, MuSiQue)
    context: list = field(default_factory=list)
    # entities of the chain before its last hop, where the data tells
    intermediates: list = field(default_factory=list)


# ----------------------------------------------------------------------------- reading files
def _open(path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def _jsonl(path):
    """(line number, object) for each non-blank line of a JSONL file, read one line at a time."""
    with _open(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                                f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
            yield n, row


def _json_list(path):
    """A file holding one JSON list (HotpotQA's layout: the whole file is one line)."""
    with _open(path) as f:
        raw = f.read()
    try:
        rows = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start})") from None
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a JSON list of questions, got a {type(rows).__name__}")
    return rows


def _field(row, name, where, kind=str):
    """``row[name]``, which must be there, of type ``kind`` and not empty."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if name not in row:
        raise DataError(f"{where}: missing field {name!r}")
    value = row[name]
    if not isinstance(value, kind) or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: field {name!r} must be a non-empty "
                        f"{getattr(kind, '__name__', 'string or number')}, "
                        f"got {json.dumps(value)[:60]}")
    return value


def _doc(row, where, error=DataError):
    """A Doc from a corpus line or a server's hit: ``{"id", "contents"}`` or
    ``{"id", "title", "text"}``."""
    if not isinstance(row, dict) or "id" not in row:
        raise error(f"{where}: missing field 'id'")
    if isinstance(row.get("contents"), str):   # no line break: a passage without a title
        title, _, text = (row["contents"].partition("\n") if "\n" in row["contents"]
                          else ("", "", row["contents"]))
        return Doc(str(row["id"]), title.strip().strip('"'), " ".join(text.split()))
    if isinstance(row.get("title"), str) and isinstance(row.get("text"), str):
        return Doc(str(row["id"]), row["title"], " ".join(row["text"].split()))
    raise error(f"{where}: missing field 'contents' (or 'title' and 'text')")


def read_corpus(path):
    """A shared corpus as a World searched by the postings BM25 (lab/retrieval.py), built on the
    first search."""
    docs = [_doc(row, f"{path}:{n}") for n, row in _jsonl(path)]
    if not docs:
        raise DataError(f"{path}: no documents")
    return retrieval.Corpus(docs, [])


# ----------------------------------------------------------------------------- formats
def read_hotpotqa(path, corpus=None):
    """HotpotQA's layout, also 2WikiMultiHopQA's: every question with its own paragraphs."""
    questions = []
    for n, row in enumerate(_json_list(path)):
        where = f"{path}: item {n}"
        qid = str(_field(row, "_id", where, (str, int)))
        where += f" (_id {qid})"
        context = row.get("context")
        if not isinstance(context, list) or not context:
            raise DataError(f"{where}: empty context" if context in ([], None)
                            else f"{where}: context is not a list")
        docs = []
        for i, par in enumerate(context):
            if not (isinstance(par, list) and len(par) == 2 and isinstance(par[0], str)
                    and isinstance(par[1], list)):
                raise DataError(f"{where}: context[{i}] is not a [title, [sentences]] pair")
            # Sentences carry their own leading spaces; squeeze what is left.
            docs.append(Doc(f"{qid}:{i}", par[0], " ".join("".join(map(str, par[1])).split())))
        by_title, support, facts = {d.title: i for i, d in enumerate(docs)}, [], []
        for fact in _field(row, "supporting_facts", where, list):
            title = fact[0] if isinstance(fact, list) and fact else fact
            if title not in by_title:
                raise DataError(
                    f"{where}: supporting fact {title!r} names no paragraph of its context")
            if docs[by_title[title]] not in support:
                support.append(docs[by_title[title]])
            facts.append((by_title[title], fact[1] if isinstance(fact, list) and len(fact) > 1
                          else None))
        answer = _field(row, "answer", where)
        questions.append(RealQuestion(qid, _field(row, "question", where), [answer],
                                      [d.id for d in support], max(1, len(support)),
                                      support=support, context=docs,
                                      sentences=_fact_sentences(facts, docs, context),
                                      intermediates=_intermediates(row, support, answer)))
    return questions


def _fact_sentences(facts, docs, context):
    """The teacher's evidence from HotpotQA's (and 2Wiki's) ``supporting_facts``, (paragraph,
    sentence id) pairs: the first EVIDENCE_DOCS paragraphs in supporting_facts order, each a Doc
    with its id and title and, as text, its first EVIDENCE_SENTENCES supporting sentences in
    supporting_facts order, written in the paragraph's order. A sentence id that is not a whole
    number in range (a few released examples point past their paragraph's end) is skipped; a
    paragraph left with none gives no Doc, and the next one counts instead."""
    chosen = {}   # paragraph index -> its sentence ids, both in supporting_facts order
    for k, i in facts:
        ids = chosen.setdefault(k, [])
        in_range = type(i) is int and 0 <= i < len(context[k][1])
        if in_range and i not in ids and len(ids) < EVIDENCE_SENTENCES:
            ids.append(i)
    picked = [(k, ids) for k, ids in chosen.items() if ids][:EVIDENCE_DOCS]
    return [Doc(docs[k].id, docs[k].title, _join(context[k][1][i] for i in sorted(ids)))
            for k, ids in picked]


def _join(sentences):
    return " ".join(" ".join(map(str, sentences)).split())


# a word ending in "." after which no sentence ends ("St. Louis"); initials ("J.", "U.S.") too
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "mt", "ft", "jr", "sr", "gen", "col", "lt",
                 "capt", "sgt", "rev", "gov", "sen", "rep", "inc", "ltd", "co", "corp", "vs", "etc",
                 "jan", "feb", "mar", "apr", "aug", "sept", "sep", "oct", "nov", "dec", "approx"}


def split_sentences(text):
    """A paragraph's sentences, for MuSiQue, whose paragraphs come unsplit: a break after ".",
    "!" or "?" (or one followed by a closing quote or bracket) and a space, unless the next word
    starts in lower case or the word before is an initial or an abbreviation in ABBREVIATIONS.
    Good enough to choose two sentences; not a parser."""
    out = []
    for piece in re.split(r"(?<=[.!?])\s+|(?<=[.!?][\"'”’)\]])\s+", text.strip()):
        last = out[-1].split()[-1].lower() if out else ""
        if out and (piece[:1].islower() or (last.endswith(".") and (
                len(last) == 2 or "." in last[:-1] or last[:-1] in ABBREVIATIONS))):
            out[-1] += " " + piece
        elif piece:
            out.append(piece)
    return out


def _intermediates(row, support, answer):
    """Entities of the chain before its last hop, where the data tells: 2Wiki's evidence triples
    but the last (compositional and inference questions), or a HotpotQA bridge question's bridge,
    the one supporting title the other supporting paragraph names. Else empty."""
    if row.get("type") in ("compositional", "inference") and isinstance(row.get("evidences"), list):
        return [str(t[2]) for t in row["evidences"][:-1] if isinstance(t, list) and len(t) == 3]
    if row.get("type") == "bridge" and len(support) == 2:
        a, b = support
        named = [x.title for x, y in ((a, b), (b, a))
                 if f" {normalize_answer(x.title)} " in f" {normalize_answer(y.text)} "]
        if len(named) == 1 and not exact_match(named[0], [answer]):
            return named
    return []


def read_musique(path, corpus=None):
    """MuSiQue's JSONL; the decomposition's answers but the last are the chain's intermediate
    entities. Unanswerable questions (MuSiQue-Full) are left out: there is no answer to reward."""
    questions = []
    for n, row in _jsonl(path):
        where = f"{path}:{n}"
        if row.get("answerable") is False:
            continue
        qid, pars = str(_field(row, "id", where, (str, int))), row.get("paragraphs")
        if not isinstance(pars, list) or not pars:
            raise DataError(f"{where}: empty paragraphs" if pars in ([], None)
                            else f"{where}: paragraphs is not a list")
        docs, support = [], []
        for i, p in enumerate(pars):
            if not (isinstance(p, dict) and isinstance(p.get("title"), str)
                    and isinstance(p.get("paragraph_text"), str)):
                raise DataError(f"{where}: paragraphs[{i}] needs a 'title' and a 'paragraph_text'")
            docs.append(Doc(f"{qid}:{i}", p["title"], " ".join(p["paragraph_text"].split())))
            if p.get("is_supporting"):
                support.append(docs[-1])
        steps = [s for s in row.get("question_decomposition") or [] if isinstance(s, dict)]
        answers = [_field(row, "answer", where)] + [str(a) for a in row.get("answer_aliases") or []]
        questions.append(RealQuestion(qid, _field(row, "question", where), answers,
                                      [d.id for d in support], max(1, len(steps), len(support)),
                                      support=support, context=docs,
                                      sentences=_musique_sentences(pars, docs, steps),
                                      intermediates=[str(s["answer"]) for s in steps[:-1]
                                                     if s.get("answer")]))
    return questions


def _musique_sentences(pars, docs, steps):
    """The teacher's evidence from MuSiQue, which marks supporting paragraphs (``is_supporting``)
    but no sentences; our reading: the first EVIDENCE_DOCS supporting paragraphs in the chain's
    order (each decomposition step's ``paragraph_support_idx``, then any it does not name, in the
    file's order), each cut to its first sentence and the first sentence that holds the step's
    answer (whole words after normalisation), or its first EVIDENCE_SENTENCES where none does.
    Not simply the first two sentences: MuSiQue's paragraphs come from single-hop datasets
    (SQuAD, Natural Questions, T-REx, Zero-Shot RE) whose fact can sit anywhere in a paragraph.
    Not the whole paragraph: the paper's budget is two sentences a document. The first sentence
    names the paragraph's subject, as a Wikipedia lead does; the answer's holds the hop's fact."""
    position = {p.get("idx", i): i for i, p in enumerate(pars)}   # steps name paragraphs by idx
    supporting = [i for i, p in enumerate(pars) if p.get("is_supporting")]
    chain = {}   # paragraph index -> its step's answer, in the chain's order
    for s in steps:
        idx = s.get("paragraph_support_idx")
        k = position.get(idx) if type(idx) is int else None
        if k in supporting and k not in chain:
            chain[k] = str(s.get("answer") or "")
    chain.update((k, "") for k in supporting if k not in chain)
    out = []
    for k, answer in list(chain.items())[:EVIDENCE_DOCS]:
        sentences, answer = split_sentences(docs[k].text), normalize_answer(answer)
        held = [i for i, x in enumerate(sentences)
                if answer and f" {answer} " in f" {normalize_answer(x)} "]
        ids = sorted({0, held[0]}) if held else range(min(EVIDENCE_SENTENCES, len(sentences)))
        out.append(Doc(docs[k].id, docs[k].title, " ".join(sentences[i] for i in ids)))
    return out


def read_jsonl_questions(path, corpus=None):
    """Search-R1 / FlashRAG questions, with optional ``supporting_facts``/``evidence``: titles or
    ids of CORPUS documents, resolved when the corpus is in memory (a server's cannot be). A
    ``[title, sentence id]`` fact uses the title only: a corpus passage (wiki-18's are 100-word
    chunks) is not the paragraph HotpotQA's sentence ids count in, so these questions have
    supporting paragraphs and no supporting sentences."""
    questions = []
    for n, row in _jsonl(path):
        where = f"{path}:{n}"
        question = _field(row, "question", where)
        answers = row.get("golden_answers", row.get("answers"))
        answers = [answers] if isinstance(answers, str) else answers
        if not isinstance(answers, list) or not answers:
            raise DataError(f"{where}: missing field 'golden_answers' (or 'answers')")
        support = []
        for ref in (row.get("supporting_facts", row.get("evidence", [])) if corpus is not None
                    else []):
            # HotpotQA style: [title, sentence]
            ref = str(ref[0] if isinstance(ref, list) and ref else ref)
            doc = corpus.doc_by_id.get(ref) or corpus.doc_by_title.get(ref)
            if doc is None:
                raise DataError(
                    f"{where}: evidence {ref!r} is no document id or title of the corpus")
            if doc not in support:
                support.append(doc)
        questions.append(RealQuestion(str(row.get("id", f"q{n}")), question,
                                      [str(a) for a in answers], [d.id for d in support],
                                      max(1, len(support)), support=support))
    return questions


READERS = {"hotpotqa": read_hotpotqa, "2wiki": read_hotpotqa, "musique": read_musique,
           "jsonl": read_jsonl_questions}


# --------------------------------------------------------------------- Search-R1's retrieval server
class ServerRetriever:
    """Search-R1's retrieval server (search_r1/search/retrieval_server.py): ``POST /retrieve`` with
    ``{"queries", "topk", "return_scores"}``, answered by
    ``{"result": [[{"document", "score"}]]}``. ``search_batch`` sends many queries in one
    request, for lab code that batches; a rollout's env searches one query at a time."""
    remote = True   # the oracle (lab/oracle.py) does not search through it a second time

    def __init__(self, url, timeout=None, attempts=None, backoff=None):
        self.url, self.timeout, self.attempts = (url, timeout or SERVER_TIMEOUT_S,
                                                 attempts or SERVER_ATTEMPTS)
        self.backoff = SERVER_BACKOFF_S if backoff is None else backoff

    def search(self, query, k=3):
        return self.search_batch([query], k)[0]

    def search_batch(self, queries, k=3):
        """Doc lists, one per query, from one request."""
        payload = self._post(json.dumps({"queries": list(queries), "topk": k,
                                         "return_scores": True}).encode())
        try:
            answer = json.loads(payload)
        except ValueError:   # not JSON, or not UTF-8
            raise RetrieverError(f"{self.url}: the answer is not JSON ({payload[:60]!r}); "
                                 "RETRIEVER_URL must be the /retrieve address of Search-R1's "
                                 "retrieval server") from None
        result = answer.get("result") if isinstance(answer, dict) else None
        if not (isinstance(result, list) and len(result) == len(queries)
                and all(isinstance(h, list) for h in result)):
            raise RetrieverError(f"{self.url}: expected {{\"result\": [...]}} holding one list of "
                                 f"hits for each of the {len(queries)} queries, got "
                                 f"{json.dumps(answer)[:80]}")
        return [[_doc(h.get("document", h) if isinstance(h, dict) else h,
                      f"{self.url}: result[{i}][{j}]", RetrieverError)
                 for j, h in enumerate(hits[:k])]
                for i, hits in enumerate(result)]

    def _post(self, body):
        """The answer's bytes. Refused connections, timeouts and 5xx statuses are retried with
        exponential backoff; a 4xx status means a wrong address and stops at once."""
        request = urllib.request.Request(self.url, data=body,
                                         headers={"Content-Type": "application/json"})
        waited = 0.0
        for attempt in range(self.attempts):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    raise RetrieverError(
                        f"{self.url}: HTTP {e.code} {e.reason}; RETRIEVER_URL must be the "
                        "/retrieve address of Search-R1's retrieval server "
                        "(http://HOST:8000/retrieve)") from None
                why = f"HTTP {e.code} {e.reason}"
            # refused, unreachable, timed out, cut off
            except (OSError, http.client.HTTPException) as e:
                why = str(getattr(e, "reason", None) or e) or type(e).__name__
            if attempt + 1 < self.attempts:
                time.sleep(self.backoff * 2 ** attempt)
                waited += self.backoff * 2 ** attempt
        raise RetrieverError(f"{self.url}: {why} on all {self.attempts} attempts over "
                             f"{waited:.0f} s; is the retrieval server running?")


# ----------------------------------------------------------------------------- a split as a world
class RealWorld(search_env.World):
    """One split of a real dataset: its questions, each one's retriever, the teacher's evidence."""

    def __init__(self, questions, name, shared=None, evidence="auto", top_k=3):
        if evidence not in EVIDENCE_RULES:
            raise DataError(f"EVIDENCE={evidence!r}: allowed values are "
                            f"{', '.join(EVIDENCE_RULES)}")
        super().__init__(docs=[], questions=questions)
        self.name, self.shared, self.rule, self.top_k = name, shared, evidence, top_k
        self._own, self._passages = {}, {}

    def retriever(self, question):
        """The shared corpus or server if there is one, else the question's own paragraphs."""
        if self.shared is not None:
            return self.shared
        if question.qid not in self._own:
            if len(self._own) >= OWN_CORPORA_KEPT:
                self._own.clear()
            self._own[question.qid] = search_env.World(question.context, [])
        return self._own[question.qid]

    def evidence_docs(self, question):
        """What EviSD's teacher reads before a search, by EVIDENCE (the module's docstring):
        ``auto`` is the first of the supporting sentences (HotpotQA, 2Wiki, MuSiQue), the
        supporting paragraphs (JSONL questions with ``supporting_facts``) and the answer
        passages that the question has."""
        rule = self.rule
        if rule == "auto":
            rule = ("sentences" if question.sentences else "paragraphs" if question.support
                    else "answer_passages")
        if rule == "sentences":
            return question.sentences
        if rule == "paragraphs":
            return question.support
        if rule == "answer_only":
            return []
        if question.qid not in self._passages:   # answer_passages: one search per question, kept;
            # as whole words
            answers = [f" {a} " for a in map(normalize_answer, question.answers) if a]
            self._passages[question.qid] = [
                d for d in self.retriever(question).search(question.question, self.top_k)
                if any(a in f" {normalize_answer(d.title + ' ' + d.text)} " for a in answers)]
        return self._passages[question.qid]


_cache = {}   # files are read, and servers and corpora set up, once per process


def _once(key, make):
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


def dataset(cfg, split):
    """The RealWorld of a split: ``train`` (RL), ``validation`` (the train file's first
    VALIDATION_QUESTIONS, at most a tenth of it, never trained on) or ``dev`` (evaluate.py)."""
    name = "DATA_DEV" if split == "dev" else "DATA_TRAIN"
    path, url, corpus = cfg[name], cfg["RETRIEVER_URL"], cfg["CORPUS"]
    if not path:
        raise DataError(
            f"DATA={cfg['DATA']!r}: the {split} split needs {name}, the path of its file")

    def make():
        shared = (_once(("server", url), lambda: ServerRetriever(url)) if url
                  else _once(("corpus", corpus), lambda: read_corpus(corpus)) if corpus else None)
        questions = _once(("questions", cfg["DATA"], path, corpus),
                          lambda: READERS[cfg["DATA"]](path, shared if corpus else None))
        held = min(VALIDATION_QUESTIONS, len(questions) // 10)
        part = {"train": questions[held:], "validation": questions[:held], "dev": questions}[split]
        if not part:
            raise DataError(f"{path}: no {split} questions (validation is the train file's first "
                            "tenth, at most 500)")
        return RealWorld([dataclasses.replace(q, split=split) for q in part], split, shared,
                         cfg["EVIDENCE"], cfg["TOP_K"])
    return _once(("world", split, path, cfg["DATA"], url, corpus, cfg["EVIDENCE"], cfg["TOP_K"]),
                 make)


def check_config(cfg):
    """Stop before any work when the data settings cannot make a meaningful run (runs.Schema)."""
    data = cfg["DATA"]
    if data == "toy":
        return
    if cfg["MODEL"] in model.SIZES:
        raise DataError(f"DATA={data!r} needs a pretrained model: the embedded "
                        f"{cfg['MODEL']!r} model has only ever read the toy world; add "
                        "config/qwen2.5-0.5b-instruct.py, or --MODEL=<HF name or directory>")
    if cfg["SFT_STEPS"]:
        raise DataError(f"SFT_STEPS={cfg['SFT_STEPS']}: the warm-up imitates the toy world's "
                        f"demonstrator, which DATA={data!r} has not; use --SFT_STEPS=0 "
                        "(Search-R1 starts RL from the instruct model)")
    if cfg["CORPUS"] and cfg["RETRIEVER_URL"]:
        raise DataError(
            "CORPUS and RETRIEVER_URL are both set: give one (searches go to one of them)")
    if data == "jsonl" and not (cfg["CORPUS"] or cfg["RETRIEVER_URL"]):
        raise DataError("DATA='jsonl' questions search a shared corpus: set CORPUS (a JSONL of "
                        "{\"id\", \"contents\"}, BM25 in memory) or RETRIEVER_URL "
                        "(Search-R1's retrieval server)")
    if cfg["RETRIEVER_URL"] and not cfg["RETRIEVER_URL"].startswith(("http://", "https://")):
        raise DataError(f"RETRIEVER_URL={cfg['RETRIEVER_URL']!r}: expected an address like "
                        "http://127.0.0.1:8000/retrieve")
    needed = {"DATA_TRAIN": cfg["RL_STEPS"] > 0, "DATA_DEV": cfg["EVAL_EVERY"] > 0,
              "CORPUS": bool(cfg["CORPUS"])}
    for name in (n for n, need in needed.items() if need and not os.path.isfile(cfg[n])):
        raise DataError(f"{name}={cfg[name]!r}: no such file; DATA={data!r} needs it "
                        "(docs/real-data.md: where to get it)")
    # read now: a bad line stops before the model loads
    for split, name in (("train", "DATA_TRAIN"), ("dev", "DATA_DEV")):
        if needed[name]:
            dataset(cfg, split)


# ----------------------------------------------------------------------------- evaluation
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


def questions(cfg, n=None, validation=False):
    """(world, questions): the dev (or validation) split, or a fixed sample of ``n`` of it."""
    world = dataset(cfg, "validation" if validation else "dev")
    qs = world.questions
    return world, (random.Random(0).sample(qs, n) if n and n < len(qs) else qs)


def dev_scores(policy, tokenizer, cfg, n=None, dtype=torch.float32, validation=False):
    """Greedy EM and answer F1 on the dev (or validation) split, or a fixed sample of ``n`` of
    its questions, with 95% intervals (Wilson; normal for F1), and EM per number of hops.
    ``macro`` is the EM, so evaluate.py's tables and paired comparison read it as a toy run's."""
    world, qs = questions(cfg, n, validation)
    em, answers = evaluate.greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)
    f1 = torch.tensor([f1_score(a, q.answers) for a, q in zip(answers, qs)], dtype=torch.float64)
    m = f1.mean().item()
    half = 1.96 * f1.std().item() / math.sqrt(len(qs)) if len(qs) > 1 else 0.0
    out = {"n": len(qs), "f1": m, "f1_ci": [m - half, m + half]}
    subsets = [("em", lambda q: True)] + [(f"hop{h}", lambda q, h=h: q.hops == h)
                                          for h in evaluate.HOPS]
    for key, keep in subsets:
        hit = [e for e, q in zip(em.tolist(), qs) if keep(q)]
        interval = list(evaluate.wilson(sum(hit), len(hit))) if hit else [None, None]
        out[key], out[f"{key}_n"], out[f"{key}_ci"] = (
            (sum(hit) / len(hit) if hit else None), len(hit), interval)
    return dict(out, macro=out["em"], macro_ci=out["em_ci"])


def quick_scores(policy, tokenizer, cfg, n, dtype=torch.float32):
    """train.py's quick check on real data: dev EM (its macro) and F1 on a fixed sample of n."""
    scores = dev_scores(policy, tokenizer, cfg, n, dtype)
    return {k: round(scores[k], 4) for k in ("n", "em", "f1", "macro")}


def dev_table(rows):
    """Real-data runs: dev EM and answer F1, each with its 95% interval (the EM is their macro)."""
    def cell(r, k):
        low, high = r[k + "_ci"]
        return f"{r[k]:.3f} [{low:.3f}, {high:.3f}]"
    return "\n".join(["| run | seed | questions | EM [95%] | F1 [95%] |", "|---|---|---|---|---|"] +
                     [f"| {r['run']} | {r['seed']} | {r['n']} | {cell(r, 'em')} | {cell(r, 'f1')} |"
                      for r in rows])
