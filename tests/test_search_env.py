"""Tests for search_env.py: normalisation, BM25, the protocol, the env and its reward (real data:
test_real_data.py)."""
import math
import random

import pytest

import search_env
import toy_world


@pytest.fixture(scope="module")
def world():
    return toy_world.make_world(seed=0)


@pytest.mark.parametrize("pred, gold, em", [
    ("The Eiffel Tower", "eiffel tower", 1.0),
    ("  an   apple!! ", "Apple", 1.0),
    ("a.b,c", "abc", 1.0),
    ("Paris.", "paris", 1.0),
    ("theatre", "atre", 0.0),          # "the" is removed only as a whole word
    ("new york", "york", 0.0),
    ("", "", 1.0),
    (None, "x", 0.0),
])
def test_exact_match(pred, gold, em):
    assert search_env.exact_match(pred, [gold]) == em


def test_exact_match_takes_max_over_answers():
    assert search_env.exact_match("babbage", ["Charles Babbage", "Babbage"]) == 1.0
    assert search_env.normalize_answer("The  Quick, brown FOX.") == "quick brown fox"


def test_bm25_ranks_expected_doc_first():
    docs = ["the cat sat on the mat", "dogs chase cats in the park",
            "a quantum computer uses qubits", "the stock market fell today",
            "cats and dogs are common pets"]
    bm25 = search_env.BM25(docs)
    assert bm25.search("quantum qubits", k=1)[0][0] == 2
    assert bm25.search("stock market", k=3)[0][0] == 3
    hits = bm25.search("cat mat", k=5)
    assert hits[0][0] == 0 and all(s > 0 for _, s in hits)
    assert bm25.search("zebra", k=3) == []          # unknown words: no hits, no error
    # Ties are broken by document order.
    tie = search_env.BM25(["alpha beta", "alpha beta", "gamma"])
    assert [i for i, _ in tie.search("alpha", k=2)] == [0, 1]


def test_bm25_matches_textbook_formula():
    docs = ["a b b c", "b c c c d", "d e"]
    bm25 = search_env.BM25(docs, k1=1.2, b=0.75)
    toks = [search_env.tokenize(d) for d in docs]
    avg = sum(map(len, toks)) / 3

    def score(q, d):
        s = 0.0
        for w in search_env.tokenize(q):
            df = sum(w in t for t in toks)
            if df == 0:
                continue
            tf = toks[d].count(w)
            idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
            s += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(toks[d]) / avg))
        return s
    for q in ("b c", "d", "c c e", "e zebra"):
        got = bm25.scores(q)
        for d in range(3):
            assert got[d] == pytest.approx(score(q, d), rel=1e-9)


def brute_force_bm25(texts, query, k1=1.2, b=0.75):
    """Okapi BM25 read off the formula, one document at a time: Lucene's idf
    log(1 + (N - df + 0.5) / (df + 0.5)) times tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl)),
    summed over the query's words in order (a repeated word counts each time)."""
    docs = [search_env.tokenize(t) for t in texts]
    avgdl = sum(map(len, docs)) / len(docs)
    scores = []
    for d in docs:
        s = 0.0
        for w in search_env.tokenize(query):
            df, tf = sum(w in other for other in docs), d.count(w)
            if tf:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
        scores.append(s)
    return scores


def test_bm25_top_k_is_the_formula_fully_sorted():
    # Few words, short documents: many exact ties, repeated words in documents and queries.
    rng = random.Random(0)
    words = ["kalo", "mira", "tor", "ven", "lunel"]
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 6))) for _ in range(60)]
    bm25 = search_env.BM25(texts)
    for query in [" ".join(rng.choices(words + ["zzz"], k=rng.randint(1, 4))) for _ in range(50)]:
        s = brute_force_bm25(texts, query)
        assert bm25.scores(query) == s          # the same sums, in the same order: bit for bit
        # every positive score, best first, ties to the lower index
        ranked = sorted((i for i in range(len(s)) if s[i] > 0), key=lambda i: (-s[i], i))
        for k in (1, 3, 100):
            assert bm25.search(query, k) == [(i, s[i]) for i in ranked[:k]]


@pytest.mark.parametrize("turn", [
    "", "just words", "<search> </search>", "<answer>   </answer>", "<search> q",
    "q </search>", "<search> a </search><answer> b </answer>",
    "<search> a <search> b </search>", "<search> <answer> b </search>",
    "<search> " + "x" * 500 + " </search>", "<search> a\x00b </search>", "<answer> a\tb </answer>",
    "<search> a </search> trailing", "<information> fake </information><answer> x </answer>",
    "<think> unclosed <answer> x </answer>", "</search>", "<answer> x </search>", None, 42,
])
def test_malformed_turns_are_invalid(turn):
    assert search_env.parse_action(turn).kind == "invalid"


@pytest.mark.parametrize("turn, why", [
    ("<answer>\udcff</answer>", "unprintable character U+DCFF"),
    ("<think> a\udcff </think><search> b </search>", "unprintable character U+DCFF"),
    ("<think> a\x07 </think><answer> b </answer>", "unprintable character U+0007"),
    ("<answer> a\x85b </answer>", "unprintable character U+0085"),
])
def test_text_no_file_can_hold_is_an_invalid_turn(turn, why):
    # The whole turn counts, thinking included: whatever prints or saves it must not break.
    assert search_env.parse_action(turn) == search_env.Action("invalid", why)


def test_valid_turns_parse():
    a = search_env.parse_action("<think> i need kalo. </think><search>  kalo mira </search>")
    assert (a.kind, a.content) == ("search", "kalo mira")
    a = search_env.parse_action(" <answer> velmar </answer>\n")
    assert (a.kind, a.content) == ("answer", "velmar")
    a = search_env.parse_action(
        "<think> first\tthis,\nthen that </think>\n<answer> velmar </answer>")
    assert (a.kind, a.content) == ("answer", "velmar")


def test_env_episode_flow(world):
    q = world.split("train")[0]
    env = search_env.SearchEnv(world, q, max_turns=3)
    r = env.step("<search> " + q.hop_queries[0] + " </search>")
    assert (not r.done
            and r.observation == search_env.format_information(world.search(q.hop_queries[0], 3)))
    r = env.step("nonsense")
    assert (not r.done and r.action.kind == "invalid"
            and r.observation == search_env.INVALID_OBSERVATION)
    r = env.step("<search> again </search>")                 # third turn = max_turns: over
    assert r.done and r.reward == 0.0 and r.observation == ""
    with pytest.raises(RuntimeError):
        env.step("<answer> x </answer>")
    env = search_env.SearchEnv(world, q)
    r = env.step(f"<answer> {q.answers[0].upper()} </answer>")
    assert r.done and r.reward == 1.0 and env.em == 1.0 and env.answer == q.answers[0].upper()


def test_the_reward_can_change_without_changing_what_evaluation_reads(world, monkeypatch):
    q = world.split("train")[0]
    monkeypatch.setattr(search_env, "outcome_reward", lambda answer, question, turns: 0.5)
    env = search_env.SearchEnv(world, q)
    r = env.step(f"<answer> {q.answers[0]} </answer>")
    assert r.reward == env.reward == 0.5 and env.em == 1.0


def test_format_information_is_the_single_format(world):
    docs = world.docs[:2]
    block = search_env.format_information(docs)
    assert block.startswith(search_env.INFO) and block.endswith(search_env.INFO_END)
    for d in docs:
        assert f" {d.title}: {d.text}" in block
    assert search_env.format_information([]) == "<information> no results. </information>"
