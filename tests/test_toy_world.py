"""Tests for toy_world.py: the synthetic world, the expert demonstrator and its habits."""
import random

import pytest

import search_env
import toy_world


@pytest.fixture(scope="module")
def world():
    return toy_world.make_world(seed=0)


def test_world_is_deterministic_per_seed():
    a, b, c = (toy_world.make_world(seed=3), toy_world.make_world(seed=3),
               toy_world.make_world(seed=4))
    assert [d.text for d in a.docs] == [d.text for d in b.docs]
    assert [q.question for q in a.questions] == [q.question for q in b.questions]
    assert [d.text for d in a.docs] != [d.text for d in c.docs]


def test_world_size_and_vocabulary(world):
    assert 200 <= len(world.docs) <= 500
    words = {w for d in world.docs for w in search_env.tokenize(d.title + " " + d.text)}
    assert len(words) < 2000
    assert len({d.title for d in world.docs}) == len(world.docs)       # names are unique
    syllables = set(toy_world.SYLLABLES) | {"ia"}
    for d in world.docs[:50]:                                            # names are spelled
        for word in d.title.split():                                     # from syllables
            if word in toy_world.FILM_WORDS + toy_world.COMPANY_WORDS:
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
    return f" {search_env.normalize_answer(phrase)} " in f" {search_env.normalize_answer(text)} "


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
    hits = [q.evidence[0] in [d.id for d in world.search(q.hop_queries[0], 3)]
            for q in world.questions]
    assert sum(hits) / len(hits) > 0.95


def test_clean_experts_score_one_on_every_train_question(world):
    rng = random.Random(0)
    for q in world.split("train"):
        ep = toy_world.expert_episode(q, world, noise=0.0, rng=rng)
        assert ep.reward == 1.0, (q.question, ep.turns)
        assert len(ep.turns) == q.hops + 1


def test_noisy_experts_are_imperfect(world):
    rng = random.Random(0)
    qs = world.split("train")[:200]
    rewards = [toy_world.expert_episode(q, world, noise=0.5, rng=rng).reward for q in qs]
    assert 0.55 < sum(rewards) / len(rewards) < 0.95


def test_stop_early_answers_the_bridge_entity_of_multi_hop_questions_only(world):
    rng = random.Random(0)
    for q in world.split("train")[:200]:
        ep = toy_world.expert_episode(q, world, stop_early=1.0, rng=rng)
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
        toy_world.make_world(seed=0, **kwargs)


def test_partial_name_habit_searches_a_first_name_and_follows_whoever_it_finds(world):
    rng = random.Random(0)
    person_questions = [q for q in world.split("train")
                        if toy_world._is_person(world, q.hop_queries[0])]
    habit = [(q, toy_world.expert_episode(q, world, partial_name=1.0, rng=rng))
             for q in person_questions[:150]]
    for q, ep in habit:
        first_query = search_env.parse_action(ep.turns[0]).content
        assert first_query == q.hop_queries[0].split()[0]            # the first name only
        if ep.reward == 0.0:     # it followed someone else: the facts it quotes are theirs
            assert q.hop_queries[0] not in ep.turns[1]
    wrong = sum(ep.reward == 0.0 for _, ep in habit) / len(habit)
    assert 0.4 < wrong < 0.9, wrong       # first names are shared: usually the wrong person
    assert all(toy_world.expert_episode(q, world, partial_name=0.0).reward == 1.0
               for q in person_questions[:150])


def test_follow_reads_the_same_relation_from_another_document(world):
    q = next(q for q in world.split("train")
             if q.hops == 2 and toy_world._is_person(world, q.hop_queries[0]))
    subject, value = q.hop_queries[0], q.hop_queries[1]
    assert (toy_world._follow(world, subject, q.hop_facts[0], subject, value)
            == (q.hop_facts[0], value))
    other = next(d.title for d in world.docs
                 if toy_world._is_person(world, d.title) and d.title != subject)
    fact, city = toy_world._follow(world, other, q.hop_facts[0], subject, value)
    assert (fact == f"{other} was born in {city}"
            and f"was born in {city}." in world.doc_by_title[other].text)
    film = next(d.title for d in world.docs if d.text.startswith("is a film"))
    # films are not born
    assert toy_world._follow(world, film, q.hop_facts[0], subject, value) is None


def test_habits_and_slips_never_step_past_the_turn_budget(world):
    # A vague first query, then a partial one on the last turn that finds nobody: the retry
    # with the full name must not step the finished env (this seed hits that case).
    rng = random.Random(0)
    for q in world.split("train"):
        for _ in range(5):
            ep = toy_world.expert_episode(q, world, noise=1.0, partial_name=1.0, rng=rng,
                                          max_turns=3)
            assert len(ep.turns) <= 3
