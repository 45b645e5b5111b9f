"""The toy world: a synthetic encyclopaedia, its questions and the expert that demonstrates them.

* ``make_world(seed)`` builds people, cities, countries, films and companies whose names are
  spelled from a fixed syllable inventory, one short document per entity, and 1-, 2- and
  3-hop questions over them. Nothing in it is known to any pretrained model, so the only way
  to answer is to search and copy.
* ``expert_episode`` writes demonstrations through the real env (search_env.SearchEnv) for
  the supervised warm-up, with the slips and habits a warm-up should leave for RL to fix. The
  chain it follows (``hop_queries``, ``hop_facts``) is also what lab/oracle.py grades against.

Run ``python toy_world.py`` for a ten-second tour of a world.
"""
import random
from dataclasses import dataclass

from search_env import (ANSWER, ANSWER_END, SEARCH, SEARCH_END, THINK, THINK_END, Doc, Question,
                        SearchEnv, World, tokenize)

# ----------------------------------------------------------------------------- the synthetic world
# Names are spelled from these syllables, so an unseen name is made of familiar pieces. Few
# syllables and two per word keep copying a name learnable by the tiny model within the warm-up
# (docs/design-notes.md: how many syllables failed).
SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "sil", "bar", "dun", "fel", "gor", "hal",
             "jin", "kel", "mor", "nas", "pel", "quin", "ros", "tam")
FILM_WORDS = ("nights", "rising", "letters", "harbor", "winter", "garden", "road", "echo")
COMPANY_WORDS = ("works", "labs", "group", "foods", "motors", "press")
FLAVOUR = ("old bridges", "long winters", "blue tiles", "river markets", "quiet streets",
           "tall towers", "spice fields", "salt lakes", "copper mines", "wooden boats")

SIZES = dict(n_people=120, n_cities=40, n_countries=10, n_films=60, n_companies=40)


def training_world(stage, seed, step, scale=1.0):
    """The world of a warm-up or RL step, named by a string ("rl/13/42"). random.Random seeds
    itself from a string's SHA-512, a number above 2^512, and validation and held-out worlds
    have small int seeds, so whatever the run's seed, it never trains on a world it is scored on."""
    return make_world(f"{stage}/{seed}/{step}", scale=scale)


def _word(rng):
    """A two-syllable word, kept as a tuple so a near-duplicate can swap a syllable."""
    return (rng.choice(SYLLABLES), rng.choice(SYLLABLES))


def _near_duplicate(words, rng):
    """Swap the last syllable of the first multi-syllable word: 'kalo mira' -> 'kalo mitor'."""
    i = next((i for i, w in enumerate(words) if len(w) > 1), None)
    if i is None:
        return words
    w = words[i][:-1] + (rng.choice([s for s in SYLLABLES if s != words[i][-1]]),)
    return words[:i] + (w,) + words[i + 1:]


def _unique_names(rng, n, make, taken, near_dup_frac, kind, owner):
    """n distinct names (tuples of syllable tuples as strings); some are near-duplicates.

    ``owner`` maps each name word to the entity type that uses it: a word never names two
    types, or a person called 'kalo lunel' would mention the city 'lunel' in every document
    that names that person, and answer questions it should not.
    """
    made, names = [], []
    for _ in range(200 * n):
        if len(names) == n:
            return names
        words = (_near_duplicate(rng.choice(made), rng) if made and rng.random() < near_dup_frac
                 else make())
        strings = ["".join(w) for w in words]
        name = " ".join(strings)
        if name not in taken and all(owner.get(w, kind) == kind for w in strings):
            taken.add(name)
            owner.update((w, kind) for w in strings)
            made.append(words)
            names.append(name)
    raise ValueError(f"make_world: only {len(names)} of {n} distinct {kind} names fit the "
                     f"{len(SYLLABLES)}-syllable inventory; use a smaller scale")


def make_world(seed=0, n_people=SIZES["n_people"], n_cities=SIZES["n_cities"],
               n_countries=SIZES["n_countries"], n_films=SIZES["n_films"],
               n_companies=SIZES["n_companies"], near_duplicate_frac=0.3, test_frac=0.2, scale=1.0):
    """A deterministic synthetic world: one document per entity and its questions.

    ``scale`` multiplies every entity count (at least 4 of each), for smaller or larger worlds.

    Splits: ``train`` and ``test`` hold 1- and 2-hop questions whose first entity is disjoint
    (so no answer chain is shared); ``ood`` holds 3-hop compositions. Facts are stated only in
    the subject's document, so a 2-hop question's second document is not surfaced by a search
    with the question text, and its answer is not in its first document.
    """
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
    rng = random.Random(seed)
    taken, owner = set(), {}
    # A small pool of first names, so many people share one and a search must use both words.
    first_names = [_word(rng) for _ in range(max(8, n_people // 8))]
    people = _unique_names(rng, n_people, lambda: (rng.choice(first_names), _word(rng)),
                           taken, near_duplicate_frac, "person", owner)
    cities = _unique_names(rng, n_cities, lambda: (_word(rng),),
                           taken, near_duplicate_frac, "city", owner)
    countries = _unique_names(rng, n_countries, lambda: (_word(rng) + ("ia",),),
                              taken, 0.0, "country", owner)
    films = _unique_names(rng, n_films, lambda: (_word(rng), (rng.choice(FILM_WORDS),)),
                          taken, near_duplicate_frac, "film", owner)
    companies = _unique_names(rng, n_companies, lambda: (_word(rng), (rng.choice(COMPANY_WORDS),)),
                              taken, 0.0, "company", owner)

    # The facts. Every entity gets the relations of its type.
    country_of = {c: rng.choice(countries) for c in cities}
    born_in = {p: rng.choice(cities) for p in people}
    shuffled = people[:]
    rng.shuffle(shuffled)
    spouse = {}  # stated only in the first partner's document
    for a, b in zip(shuffled[0:n_people // 3:2], shuffled[1:n_people // 3:2]):
        spouse[a] = b
    director = {f: rng.choice(people) for f in films}
    founder = {k: rng.choice(people) for k in companies}
    based_in = {k: rng.choice([c for c in cities if c != born_in[founder[k]]]) for k in companies}

    def other(pool, *exclude):
        return rng.choice([x for x in pool if x not in exclude])

    docs, doc_id, facts = [], {}, {}

    def add_doc(title, predicates):
        """The text states each predicate once, without repeating the title (it is shown
        beside the text), which keeps retrieved information short; an expert's thought
        uses the full sentence 'title predicate'."""
        doc_id[title] = f"d{len(docs):04d}"
        facts[title] = {r: f"{title} {p}" for r, p in predicates.items()}
        docs.append(Doc(doc_id[title], title, " ".join(p + "." for p in predicates.values())))

    # Short documents: each fact once, plus one distractor sentence naming another entity of
    # the same type, so the agent must read the relation, not grab the first name it sees.
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
        d = director[f]
        add_doc(f, {"directed_by": f"is a film directed by {d}",
                    "stars": f"stars {other(people, d, spouse.get(d))}"})
    for k in companies:
        add_doc(k, {"founded_by": f"is a company founded by {founder[k]}",
                    "based_in": f"is based in {based_in[k]}",
                    "hired": f"hired {other(people, founder[k])}"})

    # Question templates: (template, subject pool, chain of (relation, lookup)).
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
        (2, "where was the spouse of {} born?", list(spouse), ["married_to", "born_in"]),
        (3, "in which country was the director of {} born?", films,
         ["directed_by", "born_in", "located_in"]),
        (3, "in which country was the founder of {} born?", companies,
         ["founded_by", "born_in", "located_in"]),
        (3, "in which country was the spouse of {} born?", list(spouse),
         ["married_to", "born_in", "located_in"]),
    ]
    # Held-out subjects: their chains appear only in test, never in train.
    subjects = people + cities + films + companies
    test_subjects = set(rng.sample(subjects, int(round(test_frac * len(subjects)))))
    questions = []
    for hops, template, pool, chain in templates:
        for subject in pool:
            entity, queries, sentences = subject, [], []
            for r in chain:
                queries.append(entity)
                sentences.append(facts[entity][r])
                entity = rel[r][entity]
            split = "ood" if hops == 3 else ("test" if subject in test_subjects else "train")
            questions.append(Question(
                qid=f"w{seed}-q{len(questions):04d}", question=template.format(subject),
                answers=[entity], evidence=[doc_id[e] for e in queries], hops=hops, split=split,
                hop_queries=queries, hop_facts=sentences))
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
    """Read in ``title``'s document the relation that ``fact`` states about ``subject`` (whose
    value is ``value``): ('kalo tor', 'kalo mira was born in lunel', 'kalo mira', 'lunel') ->
    ('kalo tor was born in dunfel', 'dunfel'). None if that document does not state it."""
    predicate = fact[len(subject) + 1:len(fact) - len(value)]       # 'was born in '
    for sentence in world.doc_by_title[title].text.rstrip(".").split(". "):
        if sentence.startswith(predicate):
            return f"{title} {sentence}", sentence[len(predicate):]
    return None


def expert_episode(question, world, noise=0.0, rng=None, max_turns=4, top_k=3, stop_early=0.0,
                   partial_name=0.0):
    """A demonstration written through the real env: search each hop's entity, answer.

    With probability ``noise`` the episode makes one mistake: a vague first query (then a
    correct retry), a skipped hop (answers with the bridge entity), or an early answer
    (a guess before any search). Two more knobs are habits rather than slips, flaws a model
    that imitates them keeps under greedy decoding too and only the reward can correct:
    ``stop_early``, the chance that a multi-hop demonstration answers one hop early (a wrong
    *decision*); ``partial_name``, the chance that it searches the first person of its chain
    by first name only and trusts the first document that states the fact it needs (a wrong
    *query*: first names are shared by design, so that is usually someone else, whose facts
    it follows to a wrong answer).
    With ``noise=0``, ``stop_early=0`` and ``partial_name=0`` every synthetic question scores 1.0.
    """
    if not question.hop_queries:
        raise ValueError(f"question {question.qid} has no expert chain (synthetic worlds only)")
    rng = rng or random.Random(0)
    env = SearchEnv(world, question, max_turns=max_turns, top_k=top_k)
    turns, observations = [], []

    def act(text):
        turns.append(text)
        result = env.step(text)
        observations.append(result.observation)
        return result

    def search(thought, query):
        act(f"{THINK} {thought}. {THINK_END}{SEARCH} {query} {SEARCH_END}")

    if stop_early and len(question.hop_queries) > 1 and rng.random() < stop_early:
        mistake = "skip"
    else:
        mistake = rng.choice(("vague", "skip", "early")) if rng.random() < noise else None
    if mistake == "early":
        guess = rng.choice(world.docs).title
        act(f"{THINK} i think i know it. {THINK_END}{ANSWER} {guess} {ANSWER_END}")
        return Episode(question, turns, observations, env.reward, env.answer)
    hops, chain = len(question.hop_queries), question.hop_queries + question.answers[:1]
    if mistake == "skip" and hops > 1:
        hops -= 1
    partial_hop = None
    if partial_name and rng.random() < partial_name:
        partial_hop = next((i for i in range(hops) if _is_person(world, chain[i])), None)
    if mistake == "vague":
        search("search the question", chain[0].split()[0])
    entity, fact = chain[0], None    # what the agent believes the current hop's subject is
    for i in range(hops):
        if env.done:
            break
        thought = "i need " + entity if i == 0 else fact
        read = entity
        if i == partial_hop:
            first_name = entity.split()[0]
            search(thought, first_name)
            read = next((d.title for d in world.search(first_name, top_k)
                         if _follow(world, d.title, question.hop_facts[i], chain[i],
                                    chain[i + 1])), None)
            # nobody it found states the fact: search the full name after all
            if read is None:
                read = entity
                if not env.done:    # ... unless that search used the last turn
                    search("search the full name", entity)
        else:
            search(thought, entity)
        fact, entity = _follow(world, read, question.hop_facts[i], chain[i], chain[i + 1])
    if not env.done:       # entity is the answer, or the bridge when a hop was skipped
        act(f"{THINK} {fact}. {THINK_END}{ANSWER} {entity} {ANSWER_END}")
    return Episode(question, turns, observations, env.reward, env.answer)


# ----------------------------------------------------------------------------- tour
if __name__ == "__main__":
    import time
    t0 = time.perf_counter()
    world = make_world(seed=0)
    ms = 1000 * (time.perf_counter() - t0)
    words = {w for d in world.docs for w in tokenize(d.title + " " + d.text)}
    print(f"world 0: {len(world.docs)} documents, {len(words)} distinct words, "
          f"built in {ms:.0f} ms")
    print("questions per split:", {s: len(world.split(s)) for s in ("train", "test", "ood")})
    print("\n-- three documents")
    for d in world.docs[:2] + world.docs[-1:]:
        print(f"  {d.id} {d.title}: {d.text}")
    for split in ("train", "test", "ood"):
        q = [q for q in world.split(split) if q.hops == {"train": 2, "test": 1, "ood": 3}[split]][0]
        print(f"\n-- a {split} question ({q.hops} hops): {q.question}  ->  {q.answers}")
        for i in q.evidence:
            print(f"  evidence {i}: {world.doc_by_id[i].title}: {world.doc_by_id[i].text}")
    q = world.split("train")[len(world.split("train")) // 2]
    ep = expert_episode(q, world)
    print(f"\n-- an expert episode for: {q.question}")
    for turn, obs in zip(ep.turns, ep.observations):
        print("  model:", turn)
        if obs:
            print("  env:  ", obs)
    print(f"  reward = {ep.reward}")
