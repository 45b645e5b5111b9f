"""The toy world: a synthetic encyclopaedia of names no pretrained model knows (to answer, search
and copy), its questions, and the expert the warm-up imitates. ``python toy_world.py``: a tour."""
import random
from dataclasses import dataclass

from search_env import (ANSWER, ANSWER_END, SEARCH, SEARCH_END, THINK, THINK_END, Doc, Question,
                        SearchEnv, World)

# ----------------------------------------------------------------------------- the synthetic world
# Two syllables a word: an unseen name is made of familiar pieces, few enough that the tiny model
# learns to copy one within the warm-up (docs/design-notes.md: how many syllables failed).
SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "sil", "bar", "dun", "fel", "gor", "hal",
             "jin", "kel", "mor", "nas", "pel", "quin", "ros", "tam")
FILM_WORDS = ("nights", "rising", "letters", "harbor", "winter", "garden", "road", "echo")
COMPANY_WORDS = ("works", "labs", "group", "foods", "motors", "press")
FLAVOUR = ("old bridges", "long winters", "blue tiles", "river markets", "quiet streets",
           "tall towers", "spice fields", "salt lakes", "copper mines", "wooden boats")


def training_world(stage, seed, step, scale=1.0):
    """The world of a warm-up or RL step, named by a string ("rl/13/42"): random.Random seeds
    from its SHA-512, above 2^512, and scored worlds have small int seeds, so none is trained on."""
    return make_world(f"{stage}/{seed}/{step}", scale=scale)


def _word(rng):
    """A two-syllable word, kept as a tuple so a near-duplicate can swap a syllable."""
    return (rng.choice(SYLLABLES), rng.choice(SYLLABLES))


def _near_duplicate(words, rng):
    """Swap the last syllable of the first word (two or three): 'kalo mira' -> 'kator mira'."""
    first = words[0][:-1] + (rng.choice([s for s in SYLLABLES if s != words[0][-1]]),)
    return (first,) + words[1:]


def _unique_names(rng, owner, kind, n, make, near_dup_frac=0.0):
    """n distinct names of one type, some near-duplicates. A word names one type (``owner``), or a
    person 'kalo lunel' would name the city 'lunel' in every document that names that person."""
    made, names = [], []
    for _ in range(200 * n):
        if len(names) == n:
            return names
        words = (_near_duplicate(rng.choice(made), rng) if made and rng.random() < near_dup_frac
                 else make())
        strings = ["".join(w) for w in words]
        name = " ".join(strings)
        if name not in names and all(owner.get(w, kind) == kind for w in strings):
            owner.update((w, kind) for w in strings)
            made.append(words)
            names.append(name)
    raise ValueError(f"make_world: only {len(names)} of {n} distinct {kind} names fit the "
                     f"{len(SYLLABLES)}-syllable inventory; use a smaller scale")


def make_world(seed=0, n_people=120, n_cities=40, n_countries=10, n_films=60, n_companies=40,
               near_duplicate_frac=0.3, test_frac=0.2, scale=1.0):
    """A deterministic world, one document per entity (``scale`` times the counts, at least 4 each),
    and its questions: ``train``, ``test`` 1- and 2-hop on disjoint first entities, ``ood`` 3-hop.
    A fact is only in its subject's document, so a 2-hop question needs both of its documents."""
    if not isinstance(scale, (int, float)) or scale <= 0:
        raise ValueError(f"make_world: scale must be a number > 0, got {scale!r}")
    if scale != 1.0:
        n_people, n_cities, n_countries, n_films, n_companies = (
            max(4, round(n * scale))
            for n in (n_people, n_cities, n_countries, n_films, n_companies))
    for name, value, low in (("n_people", n_people, 4), ("n_cities", n_cities, 3),
                             ("n_countries", n_countries, 2), ("n_films", n_films, 1),
                             ("n_companies", n_companies, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"make_world: {name} must be an int >= {low}, got {value!r}")
    for name, value in (("near_duplicate_frac", near_duplicate_frac), ("test_frac", test_frac)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"make_world: {name} must be in [0, 1), got {value!r}")
    rng, owner = random.Random(seed), {}
    # A small pool of first names, so many people share one and a search must use both words.
    first_names = [_word(rng) for _ in range(max(8, n_people // 8))]
    people = _unique_names(rng, owner, "person", n_people,
                           lambda: (rng.choice(first_names), _word(rng)), near_duplicate_frac)
    cities = _unique_names(rng, owner, "city", n_cities, lambda: (_word(rng),), near_duplicate_frac)
    countries = _unique_names(rng, owner, "country", n_countries, lambda: (_word(rng) + ("ia",),))
    films = _unique_names(rng, owner, "film", n_films,
                          lambda: (_word(rng), (rng.choice(FILM_WORDS),)), near_duplicate_frac)
    companies = _unique_names(rng, owner, "company", n_companies,
                              lambda: (_word(rng), (rng.choice(COMPANY_WORDS),)))

    country_of = {c: rng.choice(countries) for c in cities}
    born_in = {p: rng.choice(cities) for p in people}
    shuffled = people[:]
    rng.shuffle(shuffled)
    # couples, each stated only in the first partner's document
    spouse = dict(zip(shuffled[0:n_people // 3:2], shuffled[1:n_people // 3:2]))
    director = {f: rng.choice(people) for f in films}
    founder = {k: rng.choice(people) for k in companies}
    based_in = {k: rng.choice([c for c in cities if c != born_in[founder[k]]]) for k in companies}
    docs, doc_id, facts = [], {}, {}

    def other(pool, *exclude):
        return rng.choice([x for x in pool if x not in exclude])

    def add_doc(title, predicates):
        """The text leaves out the title (shown beside it): short information; facts keep it."""
        doc_id[title] = f"d{len(docs):04d}"
        facts[title] = {r: f"{title} {p}" for r, p in predicates.items()}
        docs.append(Doc(doc_id[title], title, " ".join(p + "." for p in predicates.values())))

    # One distractor per document, another entity of a fact's type: the agent reads the relation.
    for p in people:
        s = {"born_in": f"was born in {born_in[p]}"}
        if p in spouse:
            s["married_to"] = f"is married to {spouse[p]}"
        # Never the birthplace of p or of p's spouse: that would answer a 2-hop question here.
        s["visited"] = f"once visited {other(cities, born_in[p], born_in.get(spouse.get(p)))}"
        add_doc(p, s)
    for c in cities:
        add_doc(c, {"located_in": f"is a city in {country_of[c]}",
                    "trade": f"trades with {other(countries, country_of[c])}"})
    for k in countries:
        add_doc(k, {"is": f"is a country known for its {rng.choice(FLAVOUR)}"})
    for f in films:
        add_doc(f, {"directed_by": f"is a film directed by {director[f]}",
                    "stars": f"stars {other(people, director[f], spouse.get(director[f]))}"})
    for k in companies:
        add_doc(k, {"founded_by": f"is a company founded by {founder[k]}",
                    "based_in": f"is based in {based_in[k]}",
                    "hired": f"hired {other(people, founder[k])}"})

    # Question templates: (hops, question, subject pool, chain of relations).
    rel = {"born_in": born_in, "located_in": country_of, "directed_by": director,
           "founded_by": founder, "based_in": based_in, "married_to": spouse}
    templates = [
        (1, "where was {} born?", people, ["born_in"]),
        (1, "which country is {} in?", cities, ["located_in"]),
        (1, "who directed {}?", films, ["directed_by"]),
        (1, "who founded {}?", companies, ["founded_by"]),
        (1, "where is {} based?", companies, ["based_in"]),
        (1, "who is {} married to?", list(spouse), ["married_to"]),
        (2, "where was the director of {} born?", films, ["directed_by", "born_in"]),
        (2, "in which country was {} born?", people, ["born_in", "located_in"]),
        (2, "where was the founder of {} born?", companies, ["founded_by", "born_in"]),
        (2, "in which country is {} based?", companies, ["based_in", "located_in"]),
        (2, "where was the spouse of {} born?", list(spouse), ["married_to", "born_in"])]
    # 3 hops: on from a 2-hop question's birthplace to its country
    templates += [(3, t.replace("where", "in which country"), pool, chain + ["located_in"])
                  for _, t, pool, chain in templates if t.startswith("where was the")]
    # Held-out subjects: their chains appear only in test, never in train.
    subjects = people + cities + films + companies
    test_subjects = set(rng.sample(subjects, int(round(test_frac * len(subjects)))))
    questions = []
    for hops, template, pool, chain in templates:
        for subject in pool:
            entity, queries = subject, []
            for r in chain:
                queries.append(entity)
                entity = rel[r][entity]
            split = "ood" if hops == 3 else ("test" if subject in test_subjects else "train")
            questions.append(Question(
                qid=f"w{seed}-q{len(questions):04d}", question=template.format(subject),
                answers=[entity], evidence=[doc_id[e] for e in queries], hops=hops, split=split,
                hop_queries=queries, hop_facts=[facts[e][r] for e, r in zip(queries, chain)]))
    return World(docs, questions, seed=seed)


# ---------------------------------------------------------------------------- expert demonstrations
@dataclass
class Episode:
    question: Question
    turns: list          # generated turn texts, in order
    observations: list   # env observation after each turn ("" after the last)
    reward: float
    answer: str = None


def _is_person(world, title):
    return world.doc_by_title[title].text.startswith("was born in")   # every person's first fact


def _follow(world, title, fact, subject, value):
    """Follow ``fact``'s relation ('kalo mira was born in lunel': subject 'kalo mira', value
    'lunel') in ``title``'s document: ('kalo tor was born in dunfel', 'dunfel'), or None."""
    predicate = fact[len(subject) + 1:len(fact) - len(value)]       # 'was born in '
    for sentence in world.doc_by_title[title].text.rstrip(".").split(". "):
        if sentence.startswith(predicate):
            return f"{title} {sentence}", sentence[len(predicate):]
    return None


def expert_episode(question, world, noise=0.0, rng=None, max_turns=4, top_k=3, stop_early=0.0,
                   partial_name=0.0):
    """A demonstration through the real env: search each hop's entity, answer (1.0 with all knobs
    at 0). ``noise``: the chance of one slip (a vague first query, a skipped hop, a guess). Habits
    that imitation keeps and only the reward corrects: ``stop_early`` answers a hop early (a wrong
    *decision*), ``partial_name`` searches a person by the first name alone (a wrong *query*)."""
    if not question.hop_queries:
        raise ValueError(f"question {question.qid} has no expert chain (synthetic worlds only)")
    rng = rng or random.Random(0)
    env = SearchEnv(world, question, max_turns=max_turns, top_k=top_k)
    turns, observations = [], []

    def act(thought, action):
        turns.append(f"{THINK} {thought}. {THINK_END}{action}")
        observations.append(env.step(turns[-1]).observation)

    hops, chain = len(question.hop_queries), question.hop_queries + question.answers[:1]
    mistake = "skip" if stop_early and hops > 1 and rng.random() < stop_early else None
    if mistake is None and rng.random() < noise:
        mistake = rng.choice(("vague", "skip", "early"))
    if mistake == "early":
        act("i think i know it", f"{ANSWER} {rng.choice(world.docs).title} {ANSWER_END}")
        return Episode(question, turns, observations, env.reward, env.answer)
    if mistake == "skip" and hops > 1:
        hops -= 1
    partial = partial_name and rng.random() < partial_name    # this episode has the habit
    partial_hop = next((i for i in range(hops) if partial and _is_person(world, chain[i])), None)
    if mistake == "vague":
        act("search the question", f"{SEARCH} {chain[0].split()[0]} {SEARCH_END}")
    entity, fact = chain[0], None    # what the agent believes the current hop's subject is
    for i in range(hops):
        if env.done:
            break
        thought = "i need " + entity if i == 0 else fact
        if i == partial_hop:
            first_name = entity.split()[0]
            act(thought, f"{SEARCH} {first_name} {SEARCH_END}")
            # it reads the first found document stating the fact it needs, or searches the full name
            found = [d.title for d in world.search(first_name, top_k)
                     if _follow(world, d.title, question.hop_facts[i], chain[i], chain[i + 1])]
            read = found[0] if found else entity
            if not found and not env.done:
                act("search the full name", f"{SEARCH} {entity} {SEARCH_END}")
        else:
            read = entity
            act(thought, f"{SEARCH} {entity} {SEARCH_END}")
        fact, entity = _follow(world, read, question.hop_facts[i], chain[i], chain[i + 1])
    if not env.done:       # entity is the answer, or the bridge when a hop was skipped
        act(fact, f"{ANSWER} {entity} {ANSWER_END}")
    return Episode(question, turns, observations, env.reward, env.answer)


if __name__ == "__main__":
    world = make_world(seed=0)
    print(f"world 0: {len(world.docs)} documents; questions per split:",
          {s: len(world.split(s)) for s in ("train", "test", "ood")})
    for split, hops in (("train", 2), ("test", 1), ("ood", 3)):
        q = next(q for q in world.split(split) if q.hops == hops)
        print(f"\n-- a {split} question ({hops} hops): {q.question}  ->  {q.answers}")
        for i in q.evidence:
            print(f"  evidence {i}: {world.doc_by_id[i].title}: {world.doc_by_id[i].text}")
    ep = expert_episode(q, world)
    print(f"\n-- the expert on the last one (reward {ep.reward}):")
    for turn, obs in zip(ep.turns, ep.observations):
        print("  model:", turn)
        if obs:
            print("  env:  ", obs)
