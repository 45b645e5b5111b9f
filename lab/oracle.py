"""The oracle: which of an agent's actions were good, graded against the truth a world knows.

* ``oracle_labels(world, question, turns, top_k)`` grades each generated turn of an episode:
  on a synthetic world with ``label_actions`` (the toy world knows every hop's entity and
  document), on lab/real_data.py's worlds with ``real_data_labels`` (as far as the data tells).
* ``label_shares`` turns a batch's labels into the shares train.py logs beside each RL step
  and lab/curves.py plots; lab/credit.py grades the teacher's gap against the labels.
"""
from collections import defaultdict
from dataclasses import dataclass, field

from lab import real_data
from search_env import exact_match, normalize_answer, parse_action, tokenize


@dataclass
class ActionLabel:
    kind: str            # "search" | "answer" | "invalid"
    # search: hit | partial | repeat | miss; answer: correct | premature | wrong; invalid;
    # None where real data cannot say
    label: str
    decision_ok: bool    # was the opening tag's choice right? None for invalid turns
    docs: list = field(default_factory=list)   # search: ids of the documents it retrieves


GOOD_LABELS = ("hit", "correct")    # every other label of an action's content is a bad one


def oracle_labels(world, question, turns, top_k=3):
    """One ``ActionLabel`` per generated turn, or None where the world has no oracle: a
    RealWorld's questions are graded by ``real_data_labels``, any other world's by
    ``label_actions`` (None for a question without an expert chain)."""
    if isinstance(world, real_data.RealWorld):
        return real_data_labels(question, world, turns, top_k)
    return label_actions(question, world, turns, top_k)


def search_label(found, seen):
    """``hit`` if a search found evidence its episode had not seen, ``repeat`` if it found only
    evidence already seen, ``miss`` if it found none (``found``, ``seen``: sets of evidence)."""
    return "hit" if found - seen else "repeat" if found else "miss"


# ----------------------------------------------------------------------------- the toy world
def label_actions(question, world, turns, top_k=3):
    """One ``ActionLabel`` per generated turn of an episode, from what its searches retrieve.

    search: ``partial`` if it names an entity of the chain still to be found by only part of
    its name (first names are shared, so such a query is a gamble whatever it retrieves), else
    ``hit`` if it retrieves an evidence document not seen before in the episode, ``repeat`` if
    it retrieves only evidence already seen, ``miss`` if no evidence at all.
    answer: ``correct`` (EM 1), ``premature`` (it names an intermediate entity of the chain,
    such as the bridge of a 2-hop question), ``wrong`` (anything else).
    The decision the opening tag makes: answering is right once every evidence document has
    been retrieved, searching is right while one has not.
    A search on the last allowed turn, which the env no longer runs, is graded by what it would
    retrieve (BM25 is deterministic): the label grades the query. Returns None for questions
    without an expert chain (real data has its own: ``real_data_labels``).
    """
    if not question.hop_queries:
        return None
    evidence, seen, labels = set(question.evidence), set(), []
    intermediates = question.hop_queries[1:]
    for text in turns:
        action = parse_action(text)
        all_seen = evidence <= seen
        if action.kind == "search":
            docs = [d.id for d in world.search(action.content, top_k)]
            found = evidence.intersection(docs)
            words = tokenize(action.content)
            names = [tokenize(world.doc_by_id[d].title) for d in evidence - seen]
            partial = any(words and len(words) < len(n) and set(words) <= set(n) for n in names)
            label = "partial" if partial else search_label(found, seen)
            labels.append(ActionLabel("search", label, not all_seen, docs))
            seen |= found
        elif action.kind == "answer":
            if exact_match(action.content, question.answers):
                label = "correct"
            elif exact_match(action.content, intermediates):
                label = "premature"
            else:
                label = "wrong"
            labels.append(ActionLabel("answer", label, all_seen))
        else:
            labels.append(ActionLabel("invalid", "invalid", None))
    return labels


# ----------------------------------------------------------------------------- real data
def real_data_labels(question, world, turns, top_k=3):
    """``label_actions``' labels, as far as the data can tell: a search is a ``hit`` when it
    retrieves a supporting paragraph not yet seen, a ``repeat`` when only seen ones, else a
    ``miss``; an answer ``correct``, ``premature`` (naming one of ``intermediates``) or ``wrong``;
    a decision right when it answers with every supporting paragraph seen or searches while one
    is missing. None where the data cannot say: no supporting paragraphs, or a server to ask
    again."""
    retriever = world.retriever(question)
    known = bool(question.support) and not getattr(retriever, "remote", False)
    support, seen, labels = {normalize_answer(d.title) for d in question.support}, set(), []
    for text in turns:
        action = parse_action(text)
        complete = support <= seen
        if action.kind == "search":
            label = None
            if known:   # paragraphs are told apart by title: a shared corpus has its own ids
                found = {normalize_answer(d.title)
                         for d in retriever.search(action.content, top_k)} & support
                label = search_label(found, seen)
                seen |= found
            labels.append(ActionLabel("search", label, (not complete) if known else None))
        elif action.kind == "answer":
            label = ("correct" if exact_match(action.content, question.answers)
                     else "premature" if exact_match(action.content, question.intermediates)
                     else "wrong")
            labels.append(ActionLabel("answer", label, complete if known else None))
        else:
            labels.append(ActionLabel("invalid", "invalid", None))
    return labels


# ----------------------------------------------------------------------------- a batch's shares
def label_shares(labels):
    """What the policy does, as shares of a batch's actions: each search label among searches,
    each answer label among answers, wrong decisions among actions, invalid turns among turns.
    ``labels``: one list of ActionLabels per episode (None: no oracle). The learning curves of
    lab/curves.py read these from metrics.jsonl."""
    counts = defaultdict(int)
    for episode in labels:
        for a in episode or []:
            if a.label is None:            # real data that cannot say
                continue
            counts[a.kind] += 1
            counts[f"{a.kind}_{a.label}"] += 1
            counts["decision_wrong"] += a.decision_ok is False
    turns = counts["search"] + counts["answer"] + counts["invalid"]
    out = {}
    for kind, names in (("search", ("hit", "partial", "repeat", "miss")),
                        ("answer", ("correct", "premature", "wrong"))):
        for name in names:
            share = counts[f"{kind}_{name}"] / counts[kind] if counts[kind] else None
            out[f"label_{kind}_{name}"] = share
    out["label_decision_wrong"] = counts["decision_wrong"] / max(turns - counts["invalid"], 1)
    out["label_invalid"] = counts["invalid"] / max(turns, 1)
    return out
