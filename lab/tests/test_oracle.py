"""Tests for lab/oracle.py: the toy oracle's labels of every kind of action, the partial-name
habit's searches, real data's dispatch, and a batch's label shares. (Real data's labels on its
fixtures: test_real_data.py.)"""
import os
import random

import pytest

import search_env
import toy_world
from lab import oracle, real_data

S, S_, A, A_ = search_env.SEARCH, search_env.SEARCH_END, search_env.ANSWER, search_env.ANSWER_END


@pytest.fixture(scope="module")
def world():
    return toy_world.make_world(seed=0)


def first(world, split, hops):
    return next(q for q in world.split(split) if q.hops == hops)


def search(query):
    return f"<think> look. </think>{S} {query} {S_}"


def answer(text):
    return f"<think> done. </think>{A} {text} {A_}"


def labels(world, q, turns):
    return [(a.kind, a.label, a.decision_ok) for a in oracle.oracle_labels(world, q, turns)]


def test_labels_of_a_clean_two_hop_episode(world):
    q = first(world, "train", 2)
    bridge = q.hop_queries[1]
    assert labels(world, q, [search(q.hop_queries[0]), search(bridge), answer(q.answers[0])]) == [
        ("search", "hit", True), ("search", "hit", True), ("answer", "correct", True)]


def test_premature_answer_is_the_bridge_and_a_wrong_decision(world):
    q = first(world, "train", 2)
    bridge = q.hop_queries[1]
    assert labels(world, q, [search(q.hop_queries[0]), answer(bridge)]) == [
        ("search", "hit", True), ("answer", "premature", False)]
    # The same bridge answer after all the evidence is in: the decision was right, the content not.
    assert labels(world, q, [search(q.hop_queries[0]), search(bridge), answer(bridge)])[-1] == \
        ("answer", "premature", True)


def test_repeat_miss_wrong_invalid_and_searching_too_long(world):
    q = first(world, "train", 2)
    got = labels(world, q, ["no tags at all", search(q.hop_queries[0]), search(q.hop_queries[0]),
                            search("zzz qqq"), answer("somebody else")])
    assert got == [("invalid", "invalid", None), ("search", "hit", True),
                   ("search", "repeat", True), ("search", "miss", True),
                   ("answer", "wrong", False)]
    q1 = first(world, "train", 1)
    # Once the only evidence document is in, another search is the wrong decision.
    assert labels(world, q1, [search(q1.hop_queries[0]), search(q1.hop_queries[0]),
                              answer(q1.answers[0])]) == [
        ("search", "hit", True), ("search", "repeat", False), ("answer", "correct", True)]


def test_a_search_that_finds_only_other_documents_is_a_miss(world):
    q = first(world, "train", 2)
    other = next(d.title for d in world.docs
                 if d.id not in q.evidence and d.title not in q.hop_queries)
    (got,) = oracle.oracle_labels(world, q, [search(other)])
    assert got.label == "miss" and got.docs and not set(got.docs) & set(q.evidence)


def test_three_hop_chain(world):
    q = first(world, "ood", 3)
    h0, h1, h2 = q.hop_queries
    assert labels(world, q, [search(h0), search(h1), answer(h2)]) == [
        ("search", "hit", True), ("search", "hit", True), ("answer", "premature", False)]
    assert labels(world, q, [search(h0), answer(h1)])[-1] == ("answer", "premature", False)
    assert labels(world, q, [search(h0), search(h1), search(h2), answer(q.answers[0])]) == [
        ("search", "hit", True)] * 3 + [("answer", "correct", True)]


def test_real_data_is_graded_by_its_own_reading():
    data = os.path.join(os.path.dirname(__file__), "data")
    corpus = real_data.read_corpus(os.path.join(data, "corpus.jsonl"))
    q = real_data.read_jsonl_questions(os.path.join(data, "questions.jsonl"), corpus)[0]
    # a shared corpus's questions have no expert chain: no oracle
    assert oracle.oracle_labels(corpus, q, [search("x")]) is None
    # in a RealWorld, the same question is graded as far as the data tells: its answer
    world = real_data.RealWorld([q], "dev", corpus, top_k=1)
    (got,) = oracle.oracle_labels(world, q, [answer(q.answers[0])])
    assert (got.kind, got.label) == ("answer", "correct")


def test_label_shares(world):
    q = first(world, "train", 2)
    eps = [oracle.label_actions(q, world, [search(q.hop_queries[0]), answer(q.hop_queries[1])]),
           oracle.label_actions(q, world, [search("zzz"), "junk", answer(q.answers[0])]), None]
    got = oracle.label_shares(eps)
    assert got["label_answer_premature"] == 0.5 and got["label_answer_correct"] == 0.5
    assert got["label_search_miss"] == 0.5 and got["label_search_hit"] == 0.5
    assert got["label_invalid"] == pytest.approx(1 / 5)
    # Wrong decisions: the premature answer, and answering after a miss.
    assert got["label_decision_wrong"] == pytest.approx(2 / 4)


def test_partial_name_query_is_labelled_partial_whatever_it_retrieves(world):
    q = next(q for q in world.split("train")
             if q.hops == 1 and toy_world._is_person(world, q.hop_queries[0]))
    first_name, full = q.hop_queries[0].split()[0], q.hop_queries[0]
    assert labels(world, q, [search(first_name)])[0] == ("search", "partial", True)
    assert labels(world, q, [search(full)])[0] == ("search", "hit", True)
    # Once the person's document is in, the first name names nothing still to be found.
    assert labels(world, q, [search(full), search(first_name)])[1][1] in ("repeat", "miss")


def test_the_partial_name_habits_first_search_is_labelled_partial(world):
    rng = random.Random(0)
    person_questions = [q for q in world.split("train")
                        if toy_world._is_person(world, q.hop_queries[0])][:50]
    for q in person_questions:
        ep = toy_world.expert_episode(q, world, partial_name=1.0, rng=rng)
        assert oracle.oracle_labels(world, q, ep.turns)[0].label == "partial"
