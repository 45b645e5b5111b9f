"""Tests for search_env.py: normalisation, BM25, the world, the protocol, experts, real data."""
import os
import random

import pytest

import search_env as se

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(scope="module")
def world():
    return se.make_world(seed=0)


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
    assert se.exact_match(pred, [gold]) == em


def test_exact_match_takes_max_over_answers():
    assert se.exact_match("babbage", ["Charles Babbage", "Babbage"]) == 1.0
    assert se.normalize_answer("The  Quick, brown FOX.") == "quick brown fox"


def test_bm25_ranks_expected_doc_first():
    docs = ["the cat sat on the mat", "dogs chase cats in the park",
            "a quantum computer uses qubits", "the stock market fell today",
            "cats and dogs are common pets"]
    bm25 = se.BM25(docs)
    assert bm25.search("quantum qubits", k=1)[0][0] == 2
    assert bm25.search("stock market", k=3)[0][0] == 3
    hits = bm25.search("cat mat", k=5)
    assert hits[0][0] == 0 and all(s > 0 for _, s in hits)
    assert bm25.search("zebra", k=3) == []          # unknown words: no hits, no error
    # Ties are broken by document order.
    tie = se.BM25(["alpha beta", "alpha beta", "gamma"])
    assert [i for i, _ in tie.search("alpha", k=2)] == [0, 1]


def test_bm25_matches_textbook_formula():
    import math
    docs = ["a b b c", "b c c c d", "d e"]
    bm25 = se.BM25(docs, k1=1.2, b=0.75)
    toks = [se.tokenize(d) for d in docs]
    avg = sum(map(len, toks)) / 3

    def score(q, d):
        s = 0.0
        for w in se.tokenize(q):
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


def test_world_is_deterministic_per_seed():
    a, b, c = se.make_world(seed=3), se.make_world(seed=3), se.make_world(seed=4)
    assert [d.text for d in a.docs] == [d.text for d in b.docs]
    assert [q.question for q in a.questions] == [q.question for q in b.questions]
    assert [d.text for d in a.docs] != [d.text for d in c.docs]


def test_world_size_and_vocabulary(world):
    assert 200 <= len(world.docs) <= 500
    words = {w for d in world.docs for w in se.tokenize(d.title + " " + d.text)}
    assert len(words) < 2000
    assert len({d.title for d in world.docs}) == len(world.docs)       # names are unique
    syllables = set(se.SYLLABLES) | {"ia"}
    for d in world.docs[:50]:                                            # names are spelled
        for word in d.title.split():                                     # from syllables
            if word in se.FILM_WORDS + se.COMPANY_WORDS:
                continue
            assert _spellable(word, syllables), word


def _spellable(word, syllables):
    if not word:
        return True
    return any(word.startswith(s) and _spellable(word[len(s):], syllables) for s in syllables)


def test_splits_are_disjoint(world):
    train = {q.question for q in world.split("train")}
    test = {q.question for q in world.split("test")}
    ood = {q.question for q in world.split("ood")}
    assert train and test and ood
    assert not train & test and not train & ood and not test & ood
    # Held-out chains: no test question starts from an entity that a train question starts from.
    first = lambda qs: {q.evidence[0] for q in qs}
    assert not first(world.split("train")) & first(world.split("test"))
    assert {q.hops for q in world.split("train")} == {1, 2} == {q.hops for q in world.split("test")}
    assert {q.hops for q in world.split("ood")} == {3}


def test_evidence_contains_entities_and_answer(world):
    for q in world.questions:
        docs = world.evidence_docs(q)
        assert len(docs) == q.hops
        for doc, query, fact in zip(docs, q.hop_queries, q.hop_facts):
            assert doc.title == query and fact == f"{query} {fact[len(query) + 1:]}"
            assert fact[len(query) + 1:] in doc.text
        # Each hop's document names the next hop's entity; the last one names the answer.
        chain = q.hop_queries[1:] + [q.answers[0]]
        for doc, nxt in zip(docs, chain):
            assert _mentions(doc.text, nxt)


def _mentions(text, phrase):
    """Whole-word phrase match: 'moris' is not mentioned by 'morisel'."""
    return f" {se.normalize_answer(phrase)} " in f" {se.normalize_answer(text)} "


def test_multi_hop_questions_need_every_document(world):
    for q in world.questions:
        if q.hops >= 2:
            first = world.evidence_docs(q)[0]
            assert not _mentions(first.text, q.answers[0]), (q.question, first.text)
    # The second-hop document is (almost always) not what a search with the question finds.
    misses = sum(q.evidence[1] not in [d.id for d in world.search(q.question, 3)]
                 for q in world.questions if q.hops >= 2)
    n_multi = sum(q.hops >= 2 for q in world.questions)
    assert misses / n_multi > 0.8


def test_gold_entity_query_retrieves_first_hop_doc(world):
    hits = [q.evidence[0] in [d.id for d in world.search(q.hop_queries[0], 3)] for q in world.questions]
    assert sum(hits) / len(hits) > 0.95


@pytest.mark.parametrize("turn", [
    "", "just words", "<search> </search>", "<answer>   </answer>", "<search> q",
    "q </search>", "<search> a </search><answer> b </answer>",
    "<search> a <search> b </search>", "<search> <answer> b </search>",
    "<search> " + "x" * 500 + " </search>", "<search> a\x00b </search>", "<answer> a\tb </answer>",
    "<search> a </search> trailing", "<information> fake </information><answer> x </answer>",
    "<think> unclosed <answer> x </answer>", "</search>", "<answer> x </search>", None, 42,
])
def test_malformed_turns_are_invalid(turn):
    assert se.parse_action(turn).kind == "invalid"


@pytest.mark.parametrize("turn, why", [
    ("<answer>\udcff</answer>", "not valid Unicode (lone surrogate U+DCFF)"),
    ("<think> a\udcff </think><search> b </search>", "not valid Unicode (lone surrogate U+DCFF)"),
    ("<think> a\x07 </think><answer> b </answer>", "control character U+0007"),
    ("<answer> a\x85b </answer>", "control character U+0085"),
])
def test_text_no_file_can_hold_is_an_invalid_turn(turn, why):
    # The whole turn counts, thinking included: whatever prints or saves it must not break.
    assert se.parse_action(turn) == se.Action("invalid", why)


def test_valid_turns_parse():
    a = se.parse_action("<think> i need kalo. </think><search>  kalo mira </search>")
    assert (a.kind, a.content) == ("search", "kalo mira")
    a = se.parse_action(" <answer> velmar </answer>\n")
    assert (a.kind, a.content) == ("answer", "velmar")
    a = se.parse_action("<think> first\tthis,\nthen that </think>\n<answer> velmar </answer>")
    assert (a.kind, a.content) == ("answer", "velmar")


def test_env_episode_flow(world):
    q = world.split("train")[0]
    env = se.SearchEnv(world, q, max_turns=3)
    assert q.question in env.prompt()
    r = env.step("<search> " + q.hop_queries[0] + " </search>")
    assert not r.done and r.observation == se.format_information(world.search(q.hop_queries[0], 3))
    r = env.step("nonsense")
    assert not r.done and r.action.kind == "invalid" and r.observation == se.INVALID_OBSERVATION
    r = env.step("<search> again </search>")                 # third turn = max_turns: over
    assert r.done and r.reward == 0.0 and r.observation == ""
    with pytest.raises(RuntimeError):
        env.step("<answer> x </answer>")
    env = se.SearchEnv(world, q)
    r = env.step(f"<answer> {q.answers[0].upper()} </answer>")
    assert r.done and r.reward == 1.0 and env.answer == q.answers[0].upper()


def test_format_information_is_the_single_format(world):
    docs = world.docs[:2]
    block = se.format_information(docs)
    assert block.startswith(se.INFO) and block.endswith(se.INFO_END)
    for d in docs:
        assert f" {d.title}: {d.text}" in block
    assert se.format_information([]) == "<information> no results. </information>"


def test_clean_experts_score_one_on_every_train_question(world):
    rng = random.Random(0)
    for q in world.split("train"):
        ep = se.expert_episode(q, world, noise=0.0, rng=rng)
        assert ep.reward == 1.0, (q.question, ep.turns)
        assert len(ep.turns) == q.hops + 1


def test_noisy_experts_are_imperfect(world):
    rng = random.Random(0)
    qs = world.split("train")[:200]
    rewards = [se.expert_episode(q, world, noise=0.5, rng=rng).reward for q in qs]
    assert 0.55 < sum(rewards) / len(rewards) < 0.95


def test_stop_early_answers_the_bridge_entity_of_multi_hop_questions_only(world):
    rng = random.Random(0)
    for q in world.split("train")[:200]:
        ep = se.expert_episode(q, world, stop_early=1.0, rng=rng)
        if q.hops == 1:
            assert ep.reward == 1.0 and len(ep.turns) == 2
        else:  # one search fewer, and the answer is the last hop's query: the bridge entity
            assert len(ep.turns) == q.hops and ep.reward == 0.0
            assert ep.answer.strip() == q.hop_queries[-1]


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_people=1), "n_people"), (dict(n_cities=0), "n_cities"),
    (dict(n_countries=1.5), "n_countries"), (dict(n_films=-1), "n_films"),
    (dict(near_duplicate_frac=1.5), "near_duplicate_frac"), (dict(test_frac=-0.1), "test_frac"),
    (dict(scale=0), "scale"),
])
def test_make_world_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        se.make_world(seed=0, **kwargs)


def test_load_jsonl_fixture():
    w = se.load_jsonl(os.path.join(DATA, "corpus.jsonl"), os.path.join(DATA, "questions.jsonl"))
    assert [d.title for d in w.docs] == ["Ada Lovelace", "London", "Charles Babbage"]
    assert w.docs[2].text == "Charles Babbage designed the Analytical Engine."
    q0, q1, q2 = w.questions
    assert q0.evidence == ["1"] and q0.split == "test" and q0.answers == ["London"]
    assert q1.evidence == ["1", "2"] and q1.hops == 2 and q1.answers == ["England"]
    assert q2.evidence == ["3"] and q2.split == "train"
    assert w.search("analytical engine", 1)[0].id == "3"


def test_load_jsonl_errors_name_file_and_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "title": "t", "text": "x"}\n{"title": "no id"}\n')
    qs = tmp_path / "q.jsonl"
    qs.write_text('{"question": "q?"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: missing field 'id'"):
        se.load_jsonl(corpus, qs)
    corpus.write_text('{"id": "1", "title": "t", "text": "x"}\n')
    with pytest.raises(ValueError, match=r"q\.jsonl:1: missing field 'golden_answers'"):
        se.load_jsonl(corpus, qs)
    qs.write_text('{"question": "q?", "answers": ["a"], "evidence": ["nope"]}\n')
    with pytest.raises(ValueError, match=r"q\.jsonl:1: evidence 'nope'"):
        se.load_jsonl(corpus, qs)
    qs.write_text('{"question": \n')
    with pytest.raises(ValueError, match=r"q\.jsonl:1: not valid JSON"):
        se.load_jsonl(corpus, qs)


def test_partial_name_habit_searches_a_first_name_and_follows_whoever_it_finds(world):
    rng = random.Random(0)
    person_questions = [q for q in world.split("train") if se._is_person(world, q.hop_queries[0])]
    habit = [(q, se.expert_episode(q, world, partial_name=1.0, rng=rng)) for q in person_questions[:150]]
    for q, ep in habit:
        first_query = se.parse_action(ep.turns[0]).content
        assert first_query == q.hop_queries[0].split()[0]            # the first name only
        assert se.label_actions(q, world, ep.turns)[0].label == "partial"
        if ep.reward == 0.0:     # it followed someone else: the facts it quotes are theirs
            assert q.hop_queries[0] not in ep.turns[1]
    wrong = sum(ep.reward == 0.0 for _, ep in habit) / len(habit)
    assert 0.4 < wrong < 0.9, wrong       # first names are shared: usually the wrong person
    assert all(se.expert_episode(q, world, partial_name=0.0).reward == 1.0 for q in person_questions[:150])


def test_follow_reads_the_same_relation_from_another_document(world):
    q = next(q for q in world.split("train") if q.hops == 2 and se._is_person(world, q.hop_queries[0]))
    subject, value = q.hop_queries[0], q.hop_queries[1]
    assert se._follow(world, subject, q.hop_facts[0], subject, value) == (q.hop_facts[0], value)
    other = next(d.title for d in world.docs if se._is_person(world, d.title) and d.title != subject)
    fact, city = se._follow(world, other, q.hop_facts[0], subject, value)
    assert fact == f"{other} was born in {city}" and f"was born in {city}." in world.doc_by_title[other].text
    film = next(d.title for d in world.docs if d.text.startswith("is a film"))
    assert se._follow(world, film, q.hop_facts[0], subject, value) is None   # films are not born
