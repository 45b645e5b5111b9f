"""Tests for lab/real_data.py: every format's fixture as distributed, bad input as one line, the
big-corpus BM25 (lab/retrieval.py), Search-R1's retrieval server through a local stub (a rollout,
one request per search, its failures), the teacher's evidence and the oracle's labels on real
data (lab/oracle.py), and the pretrained-style stand-in training and evaluating (EM, F1,
--credit) on the HotpotQA fixture."""
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

import evaluate
import evisd
import model
import rollout
import search_env
import train
from lab import credit, oracle, real_data, report, retrieval
from test_keys import recording_runs
from test_rollout import ForcedLM

DATA = os.path.join(os.path.dirname(__file__), "data")
# the repository
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOTPOT = dict(DATA="hotpotqa", DATA_TRAIN=f"{DATA}/hotpot_train_v1.1.json",
              DATA_DEV=f"{DATA}/hotpot_dev_distractor_v1.json")
NQ = f"{DATA}/searchr1_nq.jsonl"
QWEN = "--MODEL=Qwen/Qwen2.5-0.5B-Instruct"   # a hub name: configure() never loads it
SMALL = ["--SFT_STEPS=0", "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2", "--MAX_TURNS=2",
         "--DEVICE=cpu"]


def cfg(**settings):
    return dict(train.DEFAULTS, **settings)


def S(query):
    return f"<think> look. </think><search> {query} </search>"


def A(answer):
    return f"<think> done. </think><answer> {answer} </answer>"


@pytest.fixture(scope="module")
def standin(standin_dir):
    lm, tok = model.load_model(standin_dir, local_files_only=True)
    return lm.eval(), tok


# ----------------------------------------------------------------------------- formats
def test_hotpotqa_fixture_loads_with_its_own_paragraphs_as_corpus():
    c = cfg(**HOTPOT)
    train_w, val_w, dev_w = (real_data.dataset(c, s) for s in ("train", "validation", "dev"))
    assert (len(train_w.questions), len(val_w.questions), len(dev_w.questions)) == (11, 1, 4)
    assert not {q.qid for q in train_w.questions} & {q.qid for q in val_w.questions}
    assert ({q.split for q in train_w.questions} == {"train"}
            and train_w.split("train") == train_w.questions)
    q = dev_w.questions[0]
    assert q.answers == ["Kessling"] and q.hops == 2 and len(q.context) == 4
    assert [d.title for d in q.support] == ["The Lantern Keeper", "Rosa Milvane"]
    # the bridge: named by the film's paragraph
    assert q.intermediates == ["Rosa Milvane"]
    assert q.support[1].text == ("Rosa Milvane (born 1966) is a film director. "
                                 "She was born in Kessling and studied in San Temo.")
    own = dev_w.retriever(q)
    assert ([d.title for d in own.search("Rosa Milvane", 1)] == ["Rosa Milvane"]
            and own.docs == q.context)
    assert dev_w.retriever(dev_w.questions[1]) is not own and dev_w.retriever(q) is own
    comparison = dev_w.questions[2]
    assert comparison.answers == ["Tessaly Mills"] and comparison.intermediates == []
    # auto: the supporting sentences, facts [The Lantern Keeper, 0] and [Rosa Milvane, 1]
    assert dev_w.evidence_docs(q) == q.sentences == [
        search_env.Doc("5ae0001dev:1", "The Lantern Keeper",
                       "The Lantern Keeper is a 2001 drama film directed by Rosa Milvane."),
        search_env.Doc("5ae0001dev:3", "Rosa Milvane",
                       "She was born in Kessling and studied in San Temo.")]


def test_2wiki_and_musique_fixtures_load():
    w = real_data.dataset(cfg(DATA="2wiki", DATA_DEV=f"{DATA}/2wiki_dev.json"), "dev")
    compositional, comparison, _ = w.questions
    assert compositional.answers == ["San Temo"] and compositional.intermediates == ["Ines Valdera"]
    assert len(compositional.support) == 2 and comparison.intermediates == []
    m = real_data.dataset(cfg(DATA="musique", DATA_DEV=f"{DATA}/musique_dev.jsonl"), "dev")
    assert len(m.questions) == 2                          # the unanswerable question is left out
    q = m.questions[0]
    assert (q.answers == ["Minato Bay", "Minato"] and q.intermediates == ["Hana Ishiro"]
            and q.hops == 2)
    assert ([d.title for d in q.support] == ["The Quiet Ferry", "Hana Ishiro"]
            and len(q.context) == 3)


def test_searchr1_jsonl_with_a_bm25_corpus_and_the_evidence_rules(standin):
    _, tok = standin
    c = cfg(DATA="jsonl", DATA_TRAIN=NQ, DATA_DEV=NQ, CORPUS=f"{DATA}/searchr1_corpus.jsonl")
    w = real_data.dataset(c, "dev")
    # wiki-18: the quoted title is the first line
    first = w.shared.docs[0]
    assert ((first.id, first.title) == ("0", "Port Halden")
            and first.text.startswith("Port Halden is a harbour"))
    q = w.questions[0]
    assert (q.question == "who built the halden lighthouse" and q.support == []
            and w.retriever(q) is w.shared)
    # No supporting facts: auto = the passages the question retrieves that hold a golden answer.
    assert [d.title for d in w.retriever(q).search(q.question, 3)] == [
        "Halden lighthouse", "Port Halden", "Aurel Strand"]
    assert [d.title for d in w.evidence_docs(q)] == ["Halden lighthouse", "Aurel Strand"]
    assert (tok.decode(evisd.privileged_ids(tok, q, w)[0])
            == search_env.format_information(w.evidence_docs(q)))
    only = real_data.dataset(dict(c, EVIDENCE="answer_only"), "dev")
    evidence, answer = evisd.privileged_ids(tok, only.questions[0], only)
    # the answer block alone
    assert evidence == [] and "the answer is Aurel Strand" in tok.decode(answer)
    hot = real_data.dataset(cfg(**HOTPOT, EVIDENCE="answer_passages"), "dev")
    # The rule's weakness, kept visible: a distractor that names the answer ("studied in
    # Kessling") counts.
    assert [d.title for d in hot.evidence_docs(hot.questions[0])] == [
        "Tobias Renner", "Rosa Milvane"]
    # A corpus of {"id", "title", "text"} lines, and supporting facts given by title or id.
    corpus = real_data.read_corpus(f"{DATA}/corpus.jsonl")
    qs = real_data.read_jsonl_questions(f"{DATA}/questions.jsonl", corpus)
    assert ([[d.id for d in q.support] for q in qs] == [["1"], ["1", "2"], ["3"]]
            and qs[1].answers == ["England"])
    # Search-R1's example corpus
    untitled = real_data._doc({"id": "7", "contents": "Evan Morris was a lobbyist."}, "x")
    assert (untitled.title, untitled.text) == ("", "Evan Morris was a lobbyist.")
    assert (search_env.format_information([untitled])
            == "<information> Evan Morris was a lobbyist. </information>")


# ------------------------------------------------------------------------- the teacher's evidence
def texts(docs):
    return [(d.title, d.text) for d in docs]


def test_supporting_sentences_on_hotpotqa_and_2wiki():
    """HotpotQA's and 2Wiki's supporting_facts name sentences: each chosen paragraph gives only
    those, at most two, in the paragraph's order, under its title."""
    hot = real_data.read_hotpotqa(f"{DATA}/hotpot_dev_distractor_v1.json")
    # a comparison question: both facts are each paragraph's second sentence
    assert texts(hot[2].sentences) == [("Delcast Foundry", "It was founded in 1848."),
                                       ("Tessaly Mills", "It was founded in 1799.")]
    assert (search_env.format_information(hot[2].sentences) == "<information> Delcast Foundry: "
            "It was founded in 1848. Tessaly Mills: It was founded in 1799. </information>")
    wiki = real_data.read_hotpotqa(f"{DATA}/2wiki_dev.json")
    assert texts(wiki[0].sentences) == [
        ("A Winter in Carrow", "A Winter in Carrow is a 1987 drama film directed by Ines Valdera."),
        ("Ines Valdera", "She was born in San Temo and studied in Lussac.")]


def test_sentences_are_capped_at_two_documents_of_two_sentences(tmp_path):
    """2Wiki's bridge-comparison fixture has four supporting paragraphs: Glass Harbour's one id
    points past its end (skipped, so the paragraph gives none), Tobias Renner's are 3, 1, 0, 1
    (the first two distinct, 1 and 3, written in order), then Ferrous Sky's 0; Jonas Weltz, the
    fourth, is over the cap. The paragraphs setting keeps all four, whole."""
    q = real_data.read_hotpotqa(f"{DATA}/2wiki_dev.json")[2]
    assert texts(q.sentences) == [
        ("Tobias Renner", "He was born in 1969 in Ostrava Vale. He taught in Lussac."),
        ("Ferrous Sky", "Ferrous Sky is a 2019 drama film directed by Jonas Weltz.")]
    assert [d.id for d in q.sentences] == ["2w0003:2", "2w0003:3"]   # the paragraphs' own ids
    assert [d.title for d in q.support] == ["Glass Harbour", "Tobias Renner", "Ferrous Sky",
                                            "Jonas Weltz"] and q.hops == 4
    assert q.support[1].text == ("Tobias Renner is a film director. He was born in 1969 in "
                                 "Ostrava Vale. He studied in Kessling. He taught in Lussac.")
    # ids that are no whole number in range are skipped; a paragraph left with none gives no Doc
    row = dict(HOTPOT_ROW, context=[["T", ["a.", " b.", " c."]], ["U", ["u."]], ["V", ["v."]]],
               supporting_facts=[["T", "1"], ["T", True], ["T", -1], ["T", 2], ["U", None],
                                 ["V", 0]])
    (tmp_path / "h.json").write_text(json.dumps([row]))
    assert (texts(real_data.read_hotpotqa(str(tmp_path / "h.json"))[0].sentences)
            == [("T", "c."), ("V", "v.")])


def test_musique_sentences_follow_the_chain_and_the_hops_answers():
    """MuSiQue marks supporting paragraphs, not sentences: the first two in the decomposition's
    order (not the file's, which puts the third hop's first), each cut to its first sentence and
    the first one naming the hop's answer, or to its first two where none does."""
    one, three = real_data.read_musique(f"{DATA}/musique_dev.jsonl")
    assert texts(one.sentences) == [
        ("The Quiet Ferry", "The Quiet Ferry is a 1993 film directed by Hana Ishiro."),
        ("Hana Ishiro", "Hana Ishiro was born in Minato Bay.")]
    assert texts(three.sentences) == [
        # the hop's answer, Jonas Weltz, is in no sentence ("J. Weltz"): the first two
        ("Ferrous Sky",
         "Ferrous Sky is a 2019 drama film. It was shot on a northern coast in forty days."),
        # the first sentence and the one holding Lussac ("St." ends no sentence)
        ("Jonas Weltz", "Jonas Weltz is a German film director. "
                        "He was born in Lussac on St. Brigid's Day in 1984.")]
    assert ([d.title for d in three.support]
            == ["Lussac Observatory", "Ferrous Sky", "Jonas Weltz"] and three.hops == 3)
    assert real_data.split_sentences('He met J. R. Tolkien. "Yes." she said. U.S. Army. Ok!') == [
        "He met J. R. Tolkien.", '"Yes." she said.', "U.S. Army.", "Ok!"]


def test_the_evidence_settings():
    """auto = sentences where the data names them; paragraphs = the whole supporting paragraphs,
    as before sentences existed; JSONL questions whose supporting facts are titles (or a title
    and a sentence id: a corpus passage is not HotpotQA's paragraph) have paragraphs only."""
    worlds = {rule: real_data.dataset(cfg(**HOTPOT, EVIDENCE=rule), "dev")
              for rule in ("auto", "sentences", "paragraphs")}
    for i in range(4):
        q = worlds["auto"].questions[i]
        assert (worlds["auto"].evidence_docs(q) == worlds["sentences"].evidence_docs(q)
                == q.sentences and len(q.sentences) == 2)
        assert worlds["paragraphs"].evidence_docs(q) == q.support
    bridge = worlds["paragraphs"].questions[0]
    assert texts(worlds["paragraphs"].evidence_docs(bridge)) == [
        ("The Lantern Keeper", "The Lantern Keeper is a 2001 drama film directed by Rosa Milvane. "
                               "It was shot on a northern coast in forty days."),
        ("Rosa Milvane", "Rosa Milvane (born 1966) is a film director. "
                         "She was born in Kessling and studied in San Temo.")]
    m = real_data.dataset(cfg(DATA="musique", DATA_DEV=f"{DATA}/musique_dev.jsonl",
                              EVIDENCE="paragraphs"), "dev")
    assert [d.title for d in m.evidence_docs(m.questions[1])] == [
        "Lussac Observatory", "Ferrous Sky", "Jonas Weltz"]
    corpus = real_data.read_corpus(f"{DATA}/corpus.jsonl")
    qs = real_data.read_jsonl_questions(f"{DATA}/questions.jsonl", corpus)
    babbage = qs[2]                                      # supporting_facts [["Charles Babbage", 0]]
    auto = real_data.RealWorld(qs, "dev", corpus, "auto")
    assert (babbage.sentences == [] and auto.evidence_docs(babbage) == babbage.support
            == [corpus.doc_by_id["3"]])
    assert real_data.RealWorld(qs, "dev", corpus, "sentences").evidence_docs(babbage) == []
    assert real_data.EVIDENCE_RULES == train.SCHEMA.choices["EVIDENCE"]
    with pytest.raises(real_data.DataError,
                       match=r"^EVIDENCE='supporting': allowed values are auto, sentences, "
                             r"paragraphs, answer_passages, answer_only$"):
        real_data.RealWorld(qs, "dev", corpus, "supporting")


def test_f1_is_hotpotqas():
    assert real_data.f1_score("the Aurel Strand", ["Aurel Strand"]) == 1.0
    assert real_data.f1_score("Strand engineer", ["x", "Aurel Strand"]) == 0.5
    assert (real_data.f1_score("yes", ["no"]) == 0.0
            and real_data.f1_score("yes it is", ["yes"]) == 0.0)
    assert real_data.f1_score(None, ["a"]) == 0.0


# ----------------------------------------------------------------------------- bad input
HOTPOT_ROW = {"_id": "a1", "question": "q?", "answer": "x", "supporting_facts": [["T", 0]],
              "context": [["T", ["x."]]]}


@pytest.mark.parametrize("reader, name, content, message", [
    ("hotpotqa", "h.json", b'[{"_id": "a1",\n "question": ',
     r"h\.json:2: not valid JSON \(Expecting value"),
    ("hotpotqa", "h.json", b'{"_id": "a1"}',
     r"h\.json: expected a JSON list of questions, got a dict"),
    ("hotpotqa", "h.json",
     json.dumps([{k: v for k, v in HOTPOT_ROW.items() if k != "answer"}]).encode(),
     r"h\.json: item 0 \(_id a1\): missing field 'answer'"),
    ("hotpotqa", "h.json", json.dumps([dict(HOTPOT_ROW, context=[])]).encode(),
     r"h\.json: item 0 \(_id a1\): empty context"),
    ("hotpotqa", "h.json",
     json.dumps([HOTPOT_ROW, dict(HOTPOT_ROW, supporting_facts=[["Nope", 0]])]).encode(),
     r"h\.json: item 1 \(_id a1\): supporting fact 'Nope' names no paragraph of its context"),
    ("hotpotqa", "h.json", json.dumps([dict(HOTPOT_ROW, context=[["T", "x."]])]).encode(),
     r"item 0 \(_id a1\): context\[0\] is not a \[title, \[sentences\]\] pair"),
    ("hotpotqa", "h.json", b'[\n{"_id": "caf\xe9"}]',
     r"h\.json:2: not UTF-8 \(byte 0xe9 at offset 14\)"),
    ("musique", "m.jsonl", b'{"id": "m", "question": "q", "answer": "a", "paragraphs": []}\n',
     r"m\.jsonl:1: empty paragraphs"),
    ("musique", "m.jsonl", b'\n[1, 2]\n', r"m\.jsonl:2: expected a JSON object, got list"),
    ("jsonl", "q.jsonl", b'{"question": "q", "golden_answers": ["a"]}\n{"question": "r"}\n',
     r"q\.jsonl:2: missing field 'golden_answers' \(or 'answers'\)"),
    ("jsonl", "q.jsonl", b'{"question": "", "golden_answers": ["a"]}\n',
     r"q\.jsonl:1: field 'question' must be a non-empty str"),
    ("jsonl", "q.jsonl", b'{"question": "\xff"}\n',
     r"q\.jsonl:1: not UTF-8 \(byte 0xff at column 15\)"),
    ("jsonl", "q.jsonl", b'{"question": "q", "golden_answers": ["a"], "evidence": ["nope"]}\n',
     r"q\.jsonl:1: evidence 'nope' is no document id or title of the corpus"),
    ("corpus", "c.jsonl", b'{"id": "1", "contents": "\\"T\\"\\nx"}\n{"contents": "y"}\n',
     r"c\.jsonl:2: missing field 'id'"),
    ("corpus", "c.jsonl", b'{"id": "1", "text": "x"}\n',
     r"c\.jsonl:1: missing field 'contents' \(or 'title' and 'text'\)"),
    ("corpus", "c.jsonl", b'{"id": 1,\n', r"c\.jsonl:1: not valid JSON"),
])
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, reader, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    corpus = real_data.read_corpus(f"{DATA}/corpus.jsonl")
    read = {"corpus": lambda p: real_data.read_corpus(p),
            **{k: lambda p, r=r: r(p, corpus) for k, r in real_data.READERS.items()}}[reader]
    with pytest.raises(real_data.DataError, match=message) as e:
        read(str(path))
    assert (isinstance(e.value, SystemExit) and "\n" not in str(e.value)
            and str(path) in str(e.value))


@pytest.mark.parametrize("args, message", [
    (["--DATA=hotpotqa"],
     r"^DATA='hotpotqa' needs a pretrained model: the embedded 'tiny' model has only ever "
     r"read the toy world; add config/qwen2\.5-0\.5b-instruct\.py, or --MODEL=<HF name or "
     r"directory>$"),
    ([QWEN, "--DATA=hotpotqa"],
     r"^SFT_STEPS=\d+: the warm-up imitates the toy world's demonstrator"),
    ([QWEN, "--SFT_STEPS=0", "--DATA=jsonl"], r"set CORPUS .* or RETRIEVER_URL"),
    ([QWEN, "--SFT_STEPS=0", "--DATA=hotpotqa", "--DATA_TRAIN=no.json"],
     r"^DATA_TRAIN='no\.json': no such file"),
    ([QWEN, "--SFT_STEPS=0", "--DATA=jsonl", "--RETRIEVER_URL=localhost:8000"],
     r"expected an address like http://"),
    ([QWEN, "--SFT_STEPS=0", "--DATA=jsonl", "--RETRIEVER_URL=http://h/retrieve", "--CORPUS=c"],
     "both set: give one"),
    (["--DATA=squad"], r"^DATA='squad': allowed values are toy, hotpotqa, 2wiki, musique, jsonl$"),
    (["--DATA=hotpotqa", "--EVIDENCE=gold"],
     r"^EVIDENCE='gold': allowed values are auto, sentences, paragraphs, answer_passages, "
     r"answer_only$"),
    # the whole paragraphs' old name
    ([QWEN, "--SFT_STEPS=0", "--DATA=hotpotqa", "--EVIDENCE=supporting"],
     r"^EVIDENCE='supporting': allowed values are auto, sentences, paragraphs, "),
])
def test_data_settings_are_checked_before_any_work(args, message):
    with pytest.raises(SystemExit, match=message):
        train.configure(args)


def test_a_bad_data_file_stops_the_command_line_with_one_line(tmp_path):
    bad = tmp_path / "hotpot.json"
    bad.write_text(json.dumps([HOTPOT_ROW, dict(HOTPOT_ROW, _id="b2", context=[])]))
    p = subprocess.run([sys.executable, "train.py", QWEN, "--SFT_STEPS=0", "--DATA=hotpotqa",
                        f"--DATA_TRAIN={bad}", f"--DATA_DEV={bad}", f"--OUT_DIR={tmp_path}/run"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr == f"{bad}: item 1 (_id b2): empty context\n"


# ----------------------------------------------------------------------------- retrieval
def test_bm25_top_k_by_partition_matches_a_full_sort_and_the_core():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    # many ties
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 8))) for _ in range(300)]
    bm25, core = retrieval.PostingsBM25(texts), search_env.BM25(texts)
    for query in ([" ".join(rng.choice(words, size=3)) for _ in range(40)]
                  + ["w1", "w1 w1 w2", "nothing at all"]):
        s = bm25.scores(query)
        assert s.tolist() == pytest.approx(core.scores(query), rel=1e-12)
        for k in (1, 3, 10, 400):
            assert bm25.search_indices(query, k) == [
                int(i) for i in np.argsort(-s, kind="stable")[:k] if s[i] > 0]
            # the same ranking as the core's plain BM25: the lab's index only makes it fast
            assert bm25.search_indices(query, k) == [i for i, _ in core.search(query, k)]


def test_a_corpus_is_searched_by_the_postings_index():
    corpus = real_data.read_corpus(f"{DATA}/searchr1_corpus.jsonl")
    assert isinstance(corpus.bm25, retrieval.PostingsBM25)
    plain = search_env.World(corpus.docs, [])
    for query in ("halden lighthouse", "kessling film school", "velmont river", "zzz"):
        assert corpus.search(query, 2) == plain.search(query, 2)


class Stub:
    """Search-R1's retrieval server in a thread, serving BM25 over a corpus; ``mode(n)`` says how
    to answer request n: None (properly), an HTTP status, "garbage", "shape" or "slow"."""

    def __init__(self, docs, mode=None):
        world, stub = search_env.World(docs, []), self
        self.requests, self.mode = [], mode or (lambda n: None)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                stub.requests.append(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body, how = stub.requests[-1], stub.mode(len(stub.requests))
                if isinstance(how, int):
                    return self.send_error(how)
                if how == "slow":
                    time.sleep(0.5)
                hits = [[{"document": {"id": d.id, "contents": f'"{d.title}"\n{d.text}'},
                          "score": 1.0}
                         for d in world.search(q, body["topk"])] for q in body["queries"]]
                payload = {"garbage": b"<html>bad gateway</html>", "shape": b'{"results": []}'}.get(
                    how, json.dumps({"result": hits}).encode())
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/retrieve"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub(real_data.read_corpus(f"{DATA}/searchr1_corpus.jsonl").docs)
    yield s
    s.close()


def test_the_server_answers_a_rollout_with_one_request_per_search(stub, standin):
    lm, tok = standin
    w = real_data.dataset(cfg(DATA="jsonl", DATA_TRAIN=NQ, DATA_DEV=NQ, RETRIEVER_URL=stub.url),
                          "dev")
    script = [S("halden lighthouse"), A("Aurel Strand")]
    envs = search_env.episodes(w, w.questions[:3], group_size=2, max_turns=2, top_k=3)
    r = rollout.rollout(ForcedLM(lm, tok, script), tok, envs, max_new_tokens=40, greedy=True)
    # each episode's env searches on its own: one request per search, not one per turn
    assert stub.requests == [{"queries": ["halden lighthouse"], "topk": 3,
                              "return_scores": True}] * 6
    info = tok.decode(r.input_ids[2][r.info_mask[2].bool()])
    assert (
        "Halden lighthouse: The Halden lighthouse was built in 1832 by the engineer Aurel Strand."
        in info)
    assert r.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # Through a server the oracle cannot search again: searches and decisions are unlabelled.
    labels = oracle.oracle_labels(w, w.questions[0], r.turn_texts[0])
    assert [(a.kind, a.label, a.decision_ok) for a in labels] == [
        ("search", None, None), ("answer", "correct", None)]
    assert len(stub.requests) == 6


@pytest.mark.parametrize("mode, requests, message", [
    (lambda n: 500 if n < 3 else None, 3, None),                    # retried, then answered
    (lambda n: 503, 3,
     r"HTTP 503 Service Unavailable on all 3 attempts over 0 s; is the retrieval server running\?"),
    (lambda n: "slow", 3, r"timed out on all 3 attempts"),
    (lambda n: 404, 1, r"HTTP 404 Not Found; RETRIEVER_URL must be the /retrieve address"),
    (lambda n: "garbage", 1, r"the answer is not JSON \(b'<html>bad gateway</html>'\)"),
    (lambda n: "shape", 1,
     r'expected \{"result": \[...\]\} holding one list of hits for each of the 2 queries, got '
     r'\{"results": \[\]\}'),
])
def test_server_failures_are_retried_then_one_line(stub, mode, requests, message):
    stub.mode = mode
    server = real_data.ServerRetriever(stub.url, timeout=0.2, attempts=3, backoff=0.01)
    if message is None:
        assert ([d.title for d in server.search_batch(["velmont river", "kessling"], 1)[1]]
                == ["Kessling"])
    else:
        with pytest.raises(real_data.RetrieverError, match=f"^{stub.url}: {message}") as e:
            server.search_batch(["velmont river", "kessling"], 1)
        assert "\n" not in str(e.value)
    time.sleep(0.6 if mode(1) == "slow" else 0)    # the slow handlers finish before the count
    assert len(stub.requests) == requests


def test_a_server_that_is_not_there(stub):
    url = stub.url
    stub.close()
    with pytest.raises(real_data.RetrieverError,
                       match=f"^{url}: .*[Cc]onnection refused.* on all 2 attempts"):
        real_data.ServerRetriever(url, attempts=2, backoff=0.01).search("x")


def forced_rollouts(script):
    """rollout.rollout, with the model forced to write ``script`` (one turn per generate call)."""
    real = rollout.rollout
    return lambda lm, tok, *args, **kw: real(ForcedLM(lm, tok, script), tok, *args, **kw)


def test_a_server_that_stays_down_stops_the_run_after_saving_a_checkpoint(stub, standin_dir,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setattr(rollout, "rollout", forced_rollouts([S("kessling film school"), A("1951")]))
    monkeypatch.setattr(real_data, "SERVER_BACKOFF_S", 0.01)
    monkeypatch.setattr(real_data, "SERVER_ATTEMPTS", 2)
    # answers step 0's searches (2 questions x 2 episodes, one request each), then goes down
    stub.mode = lambda n: None if n <= 4 else 503
    out = tmp_path / "run"
    args = [f"--MODEL={standin_dir}", "--DATA=jsonl", f"--DATA_TRAIN={NQ}", f"--DATA_DEV={NQ}",
            f"--RETRIEVER_URL={stub.url}", "--RL_STEPS=3", "--EVAL_EVERY=0", "--CKPT_EVERY=0",
            "--MAX_NEW_TOKENS=40", f"--OUT_DIR={out}"] + SMALL
    with pytest.raises(SystemExit,
                       match=rf"^{stub.url}: HTTP 503 Service Unavailable on all 2 attempts .*; "
                             rf"step 1 is saved in {out}: --resume continues "
                             rf"once the server answers$"):
        train.main(args)
    assert sorted(n for n in os.listdir(out) if n.startswith("ckpt-")) == ["ckpt-000001"]
    stub.mode = lambda n: None                               # back up: nothing was lost
    train.main(args + ["--resume"])
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    # step 0, two failed attempts, steps 1 and 2
    assert steps == [0, 1, 2] and len(stub.requests) == 4 + 2 + 4 + 4


# --------------------------------------------------------------------- labels, training, evaluation
def test_labels_on_real_evidence():
    w = real_data.dataset(cfg(**HOTPOT), "dev")
    bridge, comparison = w.questions[0], w.questions[2]
    got = lambda q, turns: [(a.kind, a.label, a.decision_ok)
                            for a in oracle.oracle_labels(w, q, turns, top_k=1)]
    assert got(bridge, [S("The Lantern Keeper"), S("Lantern Keeper drama"), S("Rosa Milvane"),
                        A("Rosa Milvane")]) == [
        ("search", "hit", True), ("search", "repeat", True), ("search", "hit", True),
        ("answer", "premature", True)]
    assert got(bridge, [S("zzz"), "junk", A("Kessling")]) == [
        ("search", "miss", True), ("invalid", "invalid", None), ("answer", "correct", False)]
    assert got(comparison, [S("Delcast Foundry"), A("Delcast Foundry")]) == [
        ("search", "hit", True), ("answer", "wrong", False)]
    nq = real_data.dataset(cfg(DATA="jsonl", DATA_TRAIN=NQ, DATA_DEV=NQ,
                               CORPUS=f"{DATA}/searchr1_corpus.jsonl"), "dev")
    # no supporting facts: a search cannot be graded
    labels = oracle.oracle_labels(nq, nq.questions[0], [S("x"), A("strand")])
    assert [(a.label, a.decision_ok) for a in labels] == [(None, None), ("correct", None)]


def hotpot_args(standin_dir, out, *extra):
    return [f"--MODEL={standin_dir}", "--DATA=hotpotqa", f"--DATA_TRAIN={HOTPOT['DATA_TRAIN']}",
            f"--DATA_DEV={HOTPOT['DATA_DEV']}", f"--OUT_DIR={out}"] + SMALL + list(extra)


def test_standin_runs_rl_and_evaluate_on_hotpotqa(standin_dir, tmp_path, capsys):
    """Search-R1's recipe (no warm-up) on the stand-in: RL steps on HotpotQA's train split with
    the quick check on dev, then evaluate.py's EM and F1 with intervals and the paired macro,
    and lab/report.py's tables.
    Random weights write garbage: this checks the path, not learning."""
    runs = {m: str(tmp_path / f"{m}-s0") for m in ("evisd", "grpo")}
    for method, out in runs.items():
        train.main(hotpot_args(standin_dir, out, f"--METHOD={method}", "--RL_STEPS=2",
                               "--MAX_NEW_TOKENS=8", "--EVAL_EVERY=2", "--EVAL_QUESTIONS=3"))
    rows = [json.loads(line) for line in open(os.path.join(runs["evisd"], "metrics.jsonl"))]
    assert ([r["step"] for r in rows] == [0, 0, 1, 2] and rows[0]["eval_n"] == 3
            and 0 <= rows[-1]["eval_f1"] <= 1)
    assert ({k for k in rows[0] if k.startswith("eval_")}
            == {"eval_n", "eval_em", "eval_f1", "eval_macro"})
    js = str(tmp_path / "eval.json")
    evaluate.main(list(runs.values()) + ["--json", js])
    got = json.load(open(js))
    for row in got["runs"]:
        assert (row["n"] == 4 and row["hop2_n"] == 4 and row["hop1"] is None
                and row["macro"] == row["em"])
        assert (row["em_ci"][0] <= row["em"] <= row["em_ci"][1]
                and row["f1_ci"][0] <= row["f1"] <= row["f1_ci"][1])
    assert got["paired"]["evisd"]["seeds"] == [0]
    printed = capsys.readouterr().out
    assert "\n  f1    " in printed and "evisd − grpo, paired by seed" in printed
    report.main(list(runs.values()))          # the lab's tables, from the cached EM
    assert "| run | seed | questions | EM [95%] | F1 [95%] |" in capsys.readouterr().out


def scripted(q, sample):
    """Even samples search both supporting paragraphs by title and answer right; odd ones miss
    and answer with the bridge (premature) or a wrong guess."""
    if sample % 2 == 0:
        return [S(q.support[0].title), S(q.support[1].title), A(q.answers[0])]
    return [S("zzz qqq"), A(q.intermediates[0] if q.intermediates else "no idea")]


def scripted_rollout(lm, tok, envs, *args, **kwargs):
    """rollout.rollout's stand-in: each episode plays ``scripted`` through its real env and
    retriever (search_env.episodes: each question's group in a row, so a sample's number is its
    place there)."""
    episodes = [env.question for env in envs]
    samples = [0]
    for prev, q in zip(episodes, episodes[1:]):
        samples.append(samples[-1] + 1 if q is prev else 0)
    texts = [scripted(q, sample) for q, sample in zip(episodes, samples)]
    trs = [rollout.encode_episode(tok, model.render_prompt(tok, q), turns,
                                [env.step(t).observation for t in turns])
           for q, env, turns in zip(episodes, envs, texts)]
    return rollout.Rollouts(**rollout.collate(trs, tok.pad_token_id),
                          rewards=torch.tensor([e.reward for e in envs]),
                          answers=[e.answer for e in envs],
                          turns=torch.tensor([e.turns for e in envs]),
                          questions=episodes, turn_texts=texts,
                          em=torch.tensor([e.em for e in envs]))


@pytest.mark.parametrize("data", ["hotpotqa", "jsonl"])
def test_real_data_reads_only_classified_settings(data, standin_dir, tmp_path, monkeypatch):
    """A real-data run under a recording config (tests/test_keys.py): the loaders, the corpus,
    the teacher's evidence and the quick check read run keys (DATA, DATA_TRAIN, CORPUS,
    EVIDENCE) and free settings (DATA_DEV) only."""
    recorded = recording_runs(monkeypatch)
    extra = ([] if data == "hotpotqa" else
             ["--DATA=jsonl", f"--DATA_TRAIN={NQ}", f"--DATA_DEV={NQ}",
              f"--CORPUS={DATA}/searchr1_corpus.jsonl"])
    train.main(hotpot_args(standin_dir, tmp_path / "run", "--RL_STEPS=1", "--EVAL_EVERY=1",
                           "--EVAL_QUESTIONS=2", "--MAX_NEW_TOKENS=8", *extra))
    reads = recorded[0].reads
    assert {"DATA", "DATA_TRAIN", "DATA_DEV", "EVIDENCE", "CORPUS"} <= reads
    assert not reads - set(train.RUN_KEYS) - set(train.FREE_KEYS)


def test_the_report_card_grades_the_teacher_on_hotpotqa_evidence(standin_dir, tmp_path,
                                                                 monkeypatch):
    """Groups that disagree (right/wrong) on HotpotQA: the EviSD step scores them with the
    supporting sentences as evidence, and --credit labels every action from the data."""
    monkeypatch.setattr(rollout, "rollout", scripted_rollout)
    out = str(tmp_path / "run")
    train.main(hotpot_args(standin_dir, out, "--RL_STEPS=1", "--EVAL_EVERY=0", "--MAX_TURNS=3",
                           "--TOP_K=1", "--MEASURE=True"))
    step = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
    assert step["label_search_hit"] == pytest.approx(4 / 6) and step["label_answer_correct"] == 0.5
    # the teacher ran
    assert step["search_gap_pos"] is not None and step["answer_gap_neg"] is not None
    card_path = str(tmp_path / "card.json")
    report.main([out, "--credit", "4", "--json", card_path])
    card = json.load(open(card_path))[out]
    shares = card["shares"]
    assert ((shares["label_search_hit"], shares["label_search_miss"])
            == pytest.approx((8 / 12, 4 / 12)))
    assert (shares["label_answer_correct"], shares["label_answer_premature"],
            shares["label_answer_wrong"]) == (0.5, 0.25, 0.25)
    assert shares["label_decision_wrong"] == pytest.approx(4 / 20)
    assert card["episodes"] == 8 and card["scored_episodes"] == 8
    parts = card["parts"]
    assert (parts["all"]["actions"] == 40 and parts["all"]["good"] == 28
            and parts["all"]["auc"] is not None)
    assert parts["answer_content"]["actions"] == 8 and parts["answer_content"]["good"] == 4
    # The credit page of the same run: every episode, each teacher's block from the data.
    from test_credit_page import Page
    page = str(tmp_path / "credit.html")
    report.main([out, "--credit-page", page])
    episodes = Page(page).episodes
    cfg = json.load(open(os.path.join(out, "config.json")))
    _, questions = credit.question_sets(cfg, cfg["QUESTIONS_PER_STEP"], validation=True)[0]
    assert len(episodes) == len(questions) * cfg["GROUP_SIZE"] > 0
    blocks = [b for ep in episodes for b in ep["blocks"]]
    searches = [b for b in blocks if b[0] == "the search teacher reads"]
    answers = [b for b in blocks if b[0] == "the answer teacher reads"]
    assert searches and answers and len(answers) == sum(ep["a"] != 0 for ep in episodes)
    assert all(b[1].startswith("<information>") for b in searches)
    assert all(b[1].startswith("<information> the answer is ") for b in answers)
