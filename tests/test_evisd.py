"""Tests for evisd.py: the paper's correction (its equation, signs, bounds, masks), the
teacher's action-aligned contexts, and each row of the paper's ablation table."""
import copy
import itertools
import math

import pytest
import torch

import evisd
import grpo
import model
import rollout
import search_env
import toy_world
import train

S, A_ = rollout.KIND_IDS["search"], rollout.KIND_IDS["answer"]


def knobs(**overrides):
    """train.py's config with EviSD constants overridden, at TEMPERATURE 1, where the teacher's
    log-probs equal a plain forward's (model.token_logprobs' default)."""
    return dict(train.DEFAULTS, TEMPERATURE=1.0, **overrides)


def correct(adv, lp_s, lp_t, gen, kind, lam=0.2, tau=5.0):
    """evisd.evisd_correction with m = the action tokens of ``_batch`` (its searches and answer),
    and the share of generated tokens it moved (what train.rl_step logs). On a real batch m is
    correction_mask's: its tests are further down."""
    mask = (kind > 0) & gen.bool()
    out = evisd.evisd_correction(adv, lp_t - lp_s, gen, mask, lam, tau)
    moved = ((out != adv[:, None]) & gen.bool()).sum().item() / gen.sum().item()
    return out, {"modulated_frac": moved}


def _batch(seed=0):
    """Two episodes: prompt, think, search span, info, think, answer span, padding."""
    torch.manual_seed(seed)
    #             prompt  think  search   info   think  answer  pad
    kind = torch.tensor([[0, 0, 0, 0, S, S, S, 0, 0, 0, 0, A_, A_, 0]] * 2)
    gen = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0]] * 2)
    info = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]] * 2)
    lp_s = -torch.rand(2, 14) * 3
    lp_t = -torch.rand(2, 14) * 3
    return kind, gen, info, lp_s, lp_t


def paper_equation(A, delta, m, lam=0.2, tau=5.0):
    """The EviSD paper's equation (as the summary gives it) transcribed literally, one token at a
    time in plain Python floats: Â_t = A + λ·|A|·m_t·tanh(τ·δ_t)."""
    return A + lam * abs(A) * m * math.tanh(tau * delta)


@pytest.mark.parametrize("lam, tau", [(0.2, 5.0), (0.5, 1.0), (0.05, 20.0)])
def test_matches_the_papers_equation_token_by_token(lam, tau):
    kind, gen, _, lp_s, lp_t = _batch(seed=3)
    adv = torch.tensor([1.3, -0.6])
    out, _ = correct(adv, lp_s, lp_t, gen, kind, lam=lam, tau=tau)
    for i in range(2):
        for t in range(14):
            if not gen[i, t]:
                assert out[i, t].item() == 0.0
                continue
            m = float(kind[i, t] > 0)
            delta = lp_t[i, t].item() - lp_s[i, t].item()
            assert out[i, t].item() == pytest.approx(
                paper_equation(adv[i].item(), delta, m, lam, tau), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("A", [[1.5, -0.7], [-2.0, 0.3]])
def test_sign_preserved_and_bounded(A):
    kind, gen, info, lp_s, lp_t = _batch()
    lp_t = lp_t * 10                                              # large gaps: tanh saturates
    adv = torch.tensor(A)
    out, stats = correct(adv, lp_s, lp_t, gen, kind, lam=0.2)
    a = adv[:, None].expand_as(out)
    on = gen.bool()
    assert (torch.sign(out[on]) == torch.sign(a[on])).all()
    assert ((out[on] - a[on]).abs() <= 0.2 * a[on].abs() + 1e-6).all()
    assert (out[~on] == 0).all()                                  # prompt, info, padding
    assert (out[info.bool()] == 0).all()
    thinking = on & (kind == 0)
    assert torch.equal(out[thinking], a[thinking])                # thinking keeps plain A
    assert stats["modulated_frac"] == pytest.approx(((kind > 0) & on).sum().item()
                                                    / on.sum().item())


def test_the_direction_follows_the_teacher_whatever_the_sign_of_a():
    """The teacher's preference (δ > 0) raises Â for A > 0 and moves it towards 0 for A < 0:
    the action is reinforced more, or penalised less. Its dislike does the opposite."""
    kind, gen, _, lp_s, _ = _batch()
    lp_t = lp_s.clone()
    lp_t[:, 4] += 0.1                                              # teacher likes the search
    lp_t[:, 11] -= 0.1                                             # and dislikes the answer
    adv = torch.tensor([2.0, -1.0])
    out, _ = correct(adv, lp_s, lp_t, gen, kind)
    assert out[0, 4] > 2.0 and -1.0 < out[1, 4] < 0               # liked: up, or less negative
    assert 0 < out[0, 11] < 2.0 and out[1, 11] < -1.0             # disliked: less, or more negative
    assert out[0, 4].item() == pytest.approx(2.0 + 0.2 * 2.0 * math.tanh(0.5), rel=1e-5)


def test_zero_gap_is_plain_grpo_and_zero_advantage_is_zero():
    kind, gen, _, lp_s, _ = _batch()
    adv = torch.tensor([0.9, -0.4])
    out, stats = correct(adv, lp_s, lp_s.clone(), gen, kind)
    assert torch.equal(out, adv[:, None] * gen) and stats["modulated_frac"] == 0
    kind, gen, _, lp_s, lp_t = _batch()
    out, _ = correct(torch.zeros(2), lp_s, lp_t, gen, kind)
    assert (out == 0).all()


def test_lambda_zero_is_plain_grpo():
    kind, gen, _, lp_s, lp_t = _batch()
    adv = torch.tensor([1.0, -1.0])
    out, stats = correct(adv, lp_s, lp_t, gen, kind, lam=0.0)
    assert torch.equal(out, adv[:, None] * gen) and stats["modulated_frac"] == 0


# ----------------------------------------------------------------------------- teacher context
def expert_setup(tok):
    """(tok, world, question, transcript): an expert episode (search, search, answer)."""
    world = toy_world.make_world(seed=5, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                 n_companies=6)
    q = [q for q in world.split("train") if q.hops == 2][0]
    ep = toy_world.expert_episode(q, world)
    tr = rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    return tok, world, q, tr


@pytest.fixture(scope="module")
def setup():
    """An expert episode encoded by the embedded tokenizer (every tag one token)."""
    return expert_setup(model.build_tokenizer(model.tokenizer_texts(seeds=(0,))))


@pytest.fixture(scope="module", params=["embedded", "pretrained-style"])
def both_tokenizers(request, setup):
    """The same, and by the pretrained-style stand-in of conftest.py (every tag several
    tokens): for the tests about where a block or a content starts among tag tokens."""
    if request.param == "embedded":
        return setup
    return expert_setup(model.load_model(request.getfixturevalue("standin_dir"),
                                         local_files_only=True)[1])


def batch_of(tok, q, transcripts, rewards=None):
    """Transcripts of question ``q`` as a Rollouts batch."""
    n = len(transcripts)
    return rollout.Rollouts(**rollout.collate(transcripts, tok.pad_token_id),
                            rewards=torch.tensor(rewards or [1.0] * n), answers=[None] * n,
                            turns=torch.tensor([len(t.spans) for t in transcripts]),
                            questions=[q] * n)


def sequences(batch):
    """A teacher_batch's sequences as [(ids, student_pos, the student positions scored)]."""
    out = []
    for u in range(len(batch["owner"])):
        n = int(batch["attention_mask"][u].sum())
        ids, pos = batch["input_ids"][u, :n].tolist(), batch["student_pos"][u, :n].tolist()
        out.append((ids, pos, {p for p, m in zip(pos, batch["score_mask"][u, :n].tolist()) if m}))
    return out


def content(spans, kind):
    return {p for s in spans if s.kind == kind for p in range(s.content_start, s.content_end)}


def test_aligned_teachers_each_read_only_their_own_block(both_tokenizers):
    """The paper's action-aligned context, by default: the search teacher's input holds the
    evidence and no token of the answer block, the answer teacher's the answer block and no
    token of the evidence; the student's own tokens in order around them."""
    tok, world, q, tr = both_tokenizers
    ev, ans = evisd.privileged_ids(tok, q, world)
    assert tok.decode(ev) == search_env.format_information(world.evidence_docs(q))
    batch = evisd.teacher_batch(tok, world, batch_of(tok, q, [tr]), [0], knobs())
    (search_ids, search_pos, search_scored), (answer_ids, answer_pos, answer_scored) = \
        sequences(batch)
    assert batch["owner"].tolist() == [0, 0]
    searches = [s for s in tr.spans if s.kind == "search"]
    answer = next(s for s in tr.spans if s.kind == "answer")
    for ids, pos in ((search_ids, search_pos), (answer_ids, answer_pos)):
        kept = [t for t, p in zip(ids, pos) if p >= 0]
        assert kept == tr.ids[:len(kept)]                 # the student's tokens, none left out
    # the search teacher: an evidence block right before each search, and nothing else
    assert [t for t, p in zip(search_ids, search_pos) if p < 0] == ev * len(searches)
    for s in searches:
        j = search_pos.index(s.action)
        assert search_ids[j - len(ev):j] == ev
    assert search_scored == content(tr.spans, "search")
    # the answer teacher: the answer block after the opening <answer> tag, and nothing else
    assert [t for t, p in zip(answer_ids, answer_pos) if p < 0] == ans
    j = answer_pos.index(answer.content_start)
    assert answer_ids[j - len(ans):j] == ans and q.answers[0] in tok.decode(ans)
    assert search_env.ANSWER in tok.decode(tr.ids[answer.action:answer.content_start])
    assert answer_scored == content(tr.spans, "answer")
    # Shared (the paper's -0.2 row): one sequence, evidence and answer before every action.
    (ids, pos, scored), = sequences(evisd.teacher_batch(
        tok, world, batch_of(tok, q, [tr]), [0], knobs(TEACHER_CONTEXT="shared")))
    assert [t for t, p in zip(ids, pos) if p < 0] == (ev + ans) * (len(searches) + 1)
    for at in [s.action for s in searches] + [answer.content_start]:
        j = pos.index(at)
        assert ids[j - len(ev + ans):j] == ev + ans
    assert scored == search_scored | answer_scored


def _three_search_episode(tok, world, first=None):
    """Searches for both hops and one repeat, then the answer; ``first``: an extra first turn."""
    q = [q for q in world.split("train") if q.hops == 2][0]
    env = search_env.SearchEnv(world, q, max_turns=5)
    turns = [first] if first else []
    turns += [f"<think> x. </think><search> {e} </search>"
              for e in q.hop_queries + q.hop_queries[:1]]
    turns.append(f"<think> y. </think><answer> {q.answers[0]} </answer>")
    observations = [env.step(t).observation for t in turns]
    return q, rollout.encode_episode(tok, model.render_prompt(tok, q), turns, observations)


def test_a_later_search_reads_a_copy_per_earlier_search_or_one(setup):
    tok, world, _, _ = setup
    q, tr = _three_search_episode(tok, world)
    ev, _ = evisd.privileged_ids(tok, q, world)
    starts = [s.action for s in tr.spans if s.kind == "search"]
    for evidence_at, copies in (("every", 3), ("first", 1)):
        (ids, pos, _), _ = sequences(evisd.teacher_batch(
            tok, world, batch_of(tok, q, [tr]), [0], knobs(EVIDENCE_AT=evidence_at)))
        assert [t for t, p in zip(ids, pos) if p < 0] == ev * copies
        j = pos.index(starts[0])
        assert ids[j - len(ev):j] == ev                   # right before the first search
        # the k-th search reads min(k, copies) copies, all before it
        assert all(sum(p < 0 for p in pos[:pos.index(at)]) == len(ev) * min(k + 1, copies)
                   for k, at in enumerate(starts))


def test_response_span_scores_every_turn_after_its_block(setup):
    """The whole-response row: every generated token is scored and corrected, thinking and
    invalid turns included; each turn's block sits before its first token."""
    tok, world, _, _ = setup
    q, tr = _three_search_episode(tok, world, first="<think> hmm </think> no tag")
    assert [s.kind for s in tr.spans] == ["invalid", "search", "search", "search", "answer"]
    settings = knobs(EVISD_SPAN="response")
    r = batch_of(tok, q, [tr])
    assert torch.equal(evisd.correction_mask(r, settings), r.gen_mask.bool())
    ev, ans = evisd.privileged_ids(tok, q, world)
    (ids, pos, scored), (a_ids, a_pos, a_scored) = sequences(
        evisd.teacher_batch(tok, world, r, [0], settings))
    turns = {s.kind: [] for s in tr.spans}
    for s in tr.spans:
        turns[s.kind].append(s)
    assert scored == {p for s in turns["invalid"] + turns["search"] for p in range(s.start, s.end)}
    assert a_scored == {p for s in turns["answer"] for p in range(s.start, s.end)}
    for s in turns["invalid"] + turns["search"]:
        j = pos.index(s.start)
        assert ids[j - len(ev):j] == ev
    j = a_pos.index(turns["answer"][0].start)
    assert a_ids[j - len(ans):j] == ans


def test_correction_mask_by_span_and_privilege(setup):
    """m covers the content (default), the whole action (tags too), or the whole response;
    without search evidence (the answer-only row), only the answer action."""
    tok, world, q, tr = setup
    r = batch_of(tok, q, [tr])
    content_m = evisd.correction_mask(r, knobs())[0]
    action_m = evisd.correction_mask(r, knobs(EVISD_SPAN="action", ANSWER_AT="tag"))[0]
    assert torch.equal(action_m, r.action_kind[0] > 0)
    # With the golden answer after the <answer> tag, the tag is read before it: not in m.
    answer = next(s for s in tr.spans if s.kind == "answer")
    after_tag = evisd.correction_mask(r, knobs(EVISD_SPAN="action"))[0]
    assert not after_tag[answer.action:answer.content_start].any()
    assert torch.equal(after_tag[:answer.action], action_m[:answer.action])
    assert torch.equal(after_tag[answer.content_start:], action_m[answer.content_start:])
    assert (content_m <= action_m).all() and content_m.sum() < action_m.sum()
    assert set(content_m.nonzero().squeeze(1).tolist()) == (content(tr.spans, "search")
                                                            | content(tr.spans, "answer"))
    answer_only = evisd.correction_mask(r, knobs(USE_SEARCH_EVIDENCE=False))[0]
    assert set(answer_only.nonzero().squeeze(1).tolist()) == content(tr.spans, "answer")
    no_answer = evisd.correction_mask(
        r, knobs(USE_ANSWER_PRIVILEGE=False, EVISD_SPAN="response"))[0]
    assert not no_answer[next(s for s in tr.spans if s.kind == "answer").start:].any()


@pytest.mark.parametrize("span", evisd.CHOICES["EVISD_SPAN"])
@pytest.mark.parametrize("answer_at", evisd.CHOICES["ANSWER_AT"])
@pytest.mark.parametrize("context", evisd.CHOICES["TEACHER_CONTEXT"])
def test_every_token_in_m_is_scored_after_its_turns_block(setup, span, answer_at, context):
    """No token's gap is taken without its privilege: in every teacher sequence, each scored
    token has a block inserted before it within its own turn, and m is exactly what is scored."""
    tok, world, _, _ = setup
    q, tr = _three_search_episode(tok, world, first="<think> hmm </think> no tag")
    settings = knobs(EVISD_SPAN=span, ANSWER_AT=answer_at, TEACHER_CONTEXT=context)
    r = batch_of(tok, q, [tr])
    scored_anywhere = set()
    for ids, pos, scored in sequences(evisd.teacher_batch(tok, world, r, [0], settings)):
        for p in scored:
            turn = next(s for s in tr.spans if s.start <= p < s.end)
            j = pos.index(p) - 1
            while pos[j] >= turn.start:        # back over this turn's own tokens
                j -= 1
            assert pos[j] < 0, (p, turn.kind, tok.decode(tr.ids[turn.start:p + 1]))
        scored_anywhere |= scored
    m = evisd.correction_mask(r, settings)[0]
    assert set(m.nonzero().squeeze(1).tolist()) == scored_anywhere and scored_anywhere


def test_content_is_the_query_or_answer_between_the_tags(both_tokenizers):
    tok, world, q, tr = both_tokenizers
    for s in tr.spans:
        if s.kind == "invalid":
            continue
        opening, closing = ((search_env.SEARCH, search_env.SEARCH_END) if s.kind == "search"
                            else (search_env.ANSWER, search_env.ANSWER_END))
        # before it: the opening tag, completed by its last token; after it: the closing tag
        assert tok.decode(tr.ids[s.action:s.content_start]).rstrip().endswith(opening)
        assert closing in tok.decode(tr.ids[s.content_end:s.end])
        assert closing not in tok.decode(tr.ids[s.action:s.content_end])
        action_text = search_env.parse_action(tok.decode(tr.ids[s.action:s.end])).content
        assert tok.decode(tr.ids[s.content_start:s.content_end]).strip() == action_text


@pytest.mark.parametrize("settings", [knobs(), knobs(TEACHER_CONTEXT="shared"),
                                      knobs(EVISD_SPAN="response", EVIDENCE_AT="first")])
def test_teacher_logprobs_align_with_a_manual_forward(setup, settings):
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    r = batch_of(tok, q, [tr, tr], [1.0, 0.0])
    lp_s = torch.full(r.input_ids.shape, -7.0)
    lp_t = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [0, 1], settings)
    seen = set()
    for ids, pos, scored in sequences(evisd.teacher_batch(tok, world, r, [0], settings)):
        full = model.token_logprobs(lm, torch.tensor([ids]), torch.ones(1, len(ids),
                                                                        dtype=torch.long))[0]
        for j, p in enumerate(pos):
            if p in scored:
                assert lp_t[0, p].item() == pytest.approx(full[j].item(), abs=1e-5)
        seen |= scored
    assert seen == set(evisd.correction_mask(r, settings)[0].nonzero().squeeze(1).tolist())
    unscored = torch.ones(r.input_ids.shape[1], dtype=torch.bool)
    unscored[list(seen)] = False
    assert (lp_t[0][unscored] == -7.0).all()                 # unscored: the student's value
    assert torch.allclose(lp_t[0], lp_t[1])
    sub = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [1], settings)   # only some episodes
    assert torch.allclose(sub[1], lp_t[1], atol=1e-6) and (sub[0] == -7.0).all()


def _noisy_turns(world, q):
    import random
    for seed in range(50):
        ep = toy_world.expert_episode(q, world, noise=1.0, rng=random.Random(seed))
        if ep.turns[0].count("<search>") and ep.reward == 0:
            return ep.turns, ep.observations
    raise AssertionError("no noisy episode with a search")


def test_teacher_logprobs_selects_rows_and_scores_duplicates_once(setup, monkeypatch):
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    other = rollout.encode_episode(tok, model.render_prompt(tok, q), *_noisy_turns(world, q))
    r = batch_of(tok, q, [tr, other, tr, tr], [0.0] * 4)
    lp_s = torch.full(r.input_ids.shape, -7.0)
    settings = knobs()
    # Every row on its own, its teacher sequences alone.
    expected = torch.stack([evisd.teacher_logprobs(lm, tok, world, r, lp_s, [i], settings)[i]
                            for i in range(4)])
    seen = []
    real = evisd.teacher_batch
    monkeypatch.setattr(evisd, "teacher_batch", lambda *a: seen.append(a[3]) or real(*a))
    got = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [0, 1, 2], settings)
    assert seen == [[0, 1]]                       # rows 0 and 2 are the same episode: one pass
    assert torch.allclose(got[:3], expected[:3], atol=1e-6)
    assert (got[3] == -7.0).all()                 # not selected: the student's log-prob, zero gap
    assert (evisd.teacher_logprobs(lm, tok, world, r, lp_s, [], settings) == -7.0).all()


@pytest.fixture(scope="module")
def step_batch(setup):
    """A tiny model, four episodes of one question (two right, two wrong), A, the student's
    log-probs: what train.rl_step hands evisd.credit."""
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    other = rollout.encode_episode(tok, model.render_prompt(tok, q), *_noisy_turns(world, q))
    r = batch_of(tok, q, [tr, other, tr, other], [1.0, 0.0, 1.0, 0.0])
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])        # the last two: A = 0
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask)
    return lm, tok, world, r, adv, lp_s


def test_credit_is_the_teacher_then_the_bounded_correction(step_batch):
    lm, tok, world, r, adv, lp_s = step_batch
    settings = knobs(EVISD_LAMBDA=0.5, EVISD_TAU=2.0)
    token_adv, lp_t, extra = evisd.credit(lm, tok, world, r, adv, lp_s, settings)
    assert extra is None
    expected_t = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [0, 1], settings)
    assert torch.allclose(lp_t, expected_t) and torch.equal(lp_t[2:], lp_s[2:])
    m = evisd.correction_mask(r, settings)
    expected = evisd.evisd_correction(adv, expected_t - lp_s, r.gen_mask, m, 0.5, 2.0)
    assert torch.allclose(token_adv, expected)
    plain = adv[:, None] * r.gen_mask
    assert torch.equal(token_adv[~m], plain[~m])          # tags and thinking keep A
    assert not torch.equal(token_adv[:2], plain[:2])      # the content moved


def test_response_row_moves_the_thinking(step_batch):
    lm, tok, world, r, adv, lp_s = step_batch
    thinking = r.gen_mask.bool() & (r.action_kind == 0)
    plain = adv[:, None] * r.gen_mask
    for span, moves in (("content", False), ("action", False), ("response", True)):
        token_adv, _, _ = evisd.credit(lm, tok, world, r, adv, lp_s, knobs(EVISD_SPAN=span))
        assert (token_adv[thinking] != plain[thinking]).any() == moves, span
        tags = (r.action_kind > 0) & ~evisd.correction_mask(r, knobs())
        assert (token_adv[tags] != plain[tags]).any() == (span != "content"), span


def test_answer_only_row_rescores_and_corrects_the_answer_alone(step_batch):
    lm, tok, world, r, adv, lp_s = step_batch
    token_adv, lp_t, _ = evisd.credit(lm, tok, world, r, adv, lp_s,
                                      knobs(USE_SEARCH_EVIDENCE=False))
    searching = r.action_kind != A_
    assert torch.equal(lp_t[searching], lp_s[searching])  # no search token re-scored
    plain = adv[:, None] * r.gen_mask
    assert torch.equal(token_adv[searching], plain[searching])
    answers = (r.action_kind == A_) & (adv[:, None] != 0)
    assert (token_adv[answers] != plain[answers]).any()


def other_values(name):
    """Every value of an EviSD knob but its default (a number: one other)."""
    default = train.DEFAULTS[name]
    if name in evisd.CHOICES:
        return [v for v in evisd.CHOICES[name] if v != default]
    return [not default] if isinstance(default, bool) else [default / 2 + 0.1]


@pytest.mark.parametrize("name", [n for n, when in evisd.KNOBS.items() if when])
def test_a_knob_declared_unread_changes_nothing_under_its_condition(step_batch, name):
    """evisd.KNOBS' declarations are true: under each condition, every other value of the knob
    gives the same token advantages, teacher log-probs and extra loss as its default."""
    lm, tok, world, r, adv, lp_s = step_batch
    for other, value in evisd.KNOBS[name].items():
        under = dict(**{other: value}, **({"EVISD_SPAN": "response"}
                                          if value == "gated_loss" else {}))
        outputs = []
        for knob_value in [train.DEFAULTS[name]] + other_values(name):
            token_adv, lp_t, extra = evisd.credit(lm, tok, world, r, adv, lp_s,
                                                  knobs(**{**under, name: knob_value}))
            outputs.append((token_adv, lp_t, extra and extra(lm, lp_s).item()))
        for token_adv, lp_t, extra in outputs[1:]:
            assert torch.equal(token_adv, outputs[0][0]) and torch.equal(lp_t, outputs[0][1])
            assert extra == outputs[0][2], (name, other)
    assert name in train.RUN_KEYS


def test_gated_loss_gradient_by_hand():
    """d loss / d logp_t = -coef * sigmoid(tau * gap_t) * m_t / (generated tokens)."""
    torch.manual_seed(0)
    gen = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]])
    m = torch.tensor([[0, 1, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    logp = (-torch.rand(2, 6) * 3).requires_grad_()
    lp_t = (-torch.rand(2, 6) * 3).requires_grad_()
    loss = evisd.gated_distillation_loss(logp, lp_t, gen, m, coef=0.3, tau=2.0)
    gap = (lp_t - logp).detach()
    n = gen.sum().item()
    by_hand = sum(0.3 * (1 / (1 + math.exp(-2.0 * gap[i, t].item()))) * gap[i, t].item() / n
                  for i in range(2) for t in range(6) if m[i, t])
    assert loss.item() == pytest.approx(by_hand, rel=1e-5)
    loss.backward()
    assert torch.allclose(logp.grad, -0.3 * torch.sigmoid(2.0 * gap) * m / n, atol=1e-7)
    # The teacher is detached: no gradient reaches its log-probs through the loss.
    assert lp_t.grad is None


def test_gated_loss_row_keeps_a_and_adds_a_response_wide_loss(step_batch):
    lm, tok, world, r, adv, lp_s = step_batch
    settings = knobs(EVISD_FORM="gated_loss", EVISD_SPAN="response")
    token_adv, lp_t, extra = evisd.credit(lm, tok, world, r, adv, lp_s, settings)
    assert torch.equal(token_adv, adv[:, None] * r.gen_mask)          # plain GRPO advantages
    assert (lp_t[2:] != lp_s[2:]).any()                                # A = 0 re-scored too
    logp = lp_s.clone().requires_grad_()
    loss = extra(lm, logp)
    loss.backward()
    expected = -0.01 * torch.sigmoid(5.0 * (lp_t - lp_s)) * r.gen_mask / r.gen_mask.sum()
    assert torch.allclose(logp.grad, expected, atol=1e-8)


@pytest.mark.parametrize("form", ["bounded", "gated_loss"])
def test_each_form_is_plain_grpo_at_coefficient_zero(step_batch, form):
    lm, tok, world, r, adv, lp_s = step_batch
    settings = knobs(EVISD_FORM=form, EVISD_LAMBDA=0.0, EVISD_GATE_COEF=0.0,
                     EVISD_SPAN="response" if form == "gated_loss" else "content")
    token_adv, _, extra = evisd.credit(lm, tok, world, r, adv, lp_s, settings)
    assert torch.equal(token_adv, adv[:, None] * r.gen_mask)
    if form == "gated_loss":
        logp = lp_s.clone().requires_grad_()
        loss = extra(lm, logp)
        loss.backward()
        assert loss.item() == 0 and (logp.grad == 0).all()


# ----------------------------------------------------------------------------- a sampled batch
@pytest.fixture(scope="module")
def sampled(tok, trained, world):
    """A batch the briefly trained tiny model sampled (test_rollout.py): 4 one-hop questions x 4
    episodes with searches, answers and invalid turns, and its group advantages."""
    torch.manual_seed(0)
    questions = [q for q in world.split("train") if q.hops == 1][:4]
    r = rollout.rollout(trained, tok, search_env.episodes(world, questions, 4, 4, 3),
                        max_new_tokens=32, temperature=1.0)
    return r, grpo.group_advantages(r.rewards, 4)


def expected_mask(r, span, evidence, answer):
    """What m must hold, read off the recorded spans: the content, the action (tags too) or the
    whole turn of each privileged kind; invalid turns count as searching under "response". Under
    "action" the <answer> tag is left out: the golden answer sits after it (ANSWER_AT="content")."""
    out = set()
    for i, spans in enumerate(r.spans):
        for s in spans:
            if s.kind == "answer" and answer or evidence and (
                    s.kind == "search" or s.kind == "invalid" and span == "response"):
                lo, hi = {"content": (s.content_start, s.content_end),
                          "action": (s.content_start if s.kind == "answer" else s.action, s.end),
                          "response": (s.start, s.end)}[span]
                out |= {(i, t) for t in range(lo, hi)}
    return out


@pytest.mark.parametrize("span", ["content", "action", "response"])
def test_correction_mask_switches_on_a_sampled_rollout(sampled, span):
    r, _ = sampled
    kinds = {s.kind for spans in r.spans for s in spans}
    assert kinds == {"search", "answer", "invalid"}          # every case occurs in the batch
    for evidence, answer in itertools.product([True, False], repeat=2):
        m = evisd.correction_mask(r, knobs(USE_SEARCH_EVIDENCE=evidence,
                                           USE_ANSWER_PRIVILEGE=answer, EVISD_SPAN=span))
        assert set(map(tuple, m.nonzero().tolist())) == expected_mask(r, span, evidence, answer), \
            (evidence, answer)
    # each switch removes something: neither kind's set is empty
    assert expected_mask(r, span, True, False) and expected_mask(r, span, False, True)


def test_tags_and_thinking_keep_plain_a_on_a_sampled_rollout(sampled, tok, trained, world):
    """The default span: the gap moves the content of actions, while the tags around it and
    the thinking before it keep the episode's plain A."""
    r, adv = sampled
    with torch.no_grad():
        lp_s = model.token_logprobs(trained, r.input_ids, r.attention_mask, r.gen_mask)
    token_adv, _, _ = evisd.credit(trained, tok, world, r, adv, lp_s, knobs())
    plain = adv[:, None] * r.gen_mask
    tags = torch.zeros_like(r.gen_mask, dtype=torch.bool)
    content = torch.zeros_like(tags)
    for i, spans in enumerate(r.spans):
        for s in spans:
            if s.kind != "invalid":
                tags[i, s.action:s.content_start] = tags[i, s.content_end:s.end] = True
                content[i, s.content_start:s.content_end] = True
    thinking = r.gen_mask.bool() & (r.action_kind == 0)
    assert tags.any() and thinking.any()
    assert torch.equal(token_adv[tags | thinking], plain[tags | thinking])
    moved = content & (adv[:, None] != 0)
    assert (token_adv[moved] != plain[moved]).float().mean() > 0.5


def test_no_gradient_reaches_the_policy_through_the_gap(sampled, tok, trained, world):
    """Â must act as a constant in the policy loss: the policy's gradient is that of the loss
    with Â frozen, even when the caller hands credit the student's log-probs with their graph
    (train.rl_step detaches them; this guards evisd's own stop-gradient)."""
    r, adv = sampled
    policy = copy.deepcopy(trained)
    logp = model.token_logprobs(policy, r.input_ids, r.attention_mask, r.gen_mask)   # with graph
    token_adv, lp_t, _ = evisd.credit(policy, tok, world, r, adv, logp, knobs())
    assert lp_t.grad_fn is None                                   # the teacher: no graph
    assert (token_adv != adv[:, None] * r.gen_mask).any()         # the gap did move Â
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = {}
    for name, advantages in (("as returned", token_adv), ("frozen", token_adv.detach().clone())):
        loss, _ = grpo.policy_loss(logp, logp.detach(), None, advantages, r.gen_mask)
        grads[name] = torch.autograd.grad(loss, params, retain_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(grads["as returned"], grads["frozen"]))
