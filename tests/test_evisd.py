"""Tests for evisd.py: the paper's correction (its equation, signs, bounds, masks) and the
teacher context."""
import math

import pytest
import torch

import evisd
import model
import search_env
import toy_world
import train

S, A_ = model.KIND_IDS["search"], model.KIND_IDS["answer"]
# One block before the first search, one before the opening <answer>: the simplest placement.
FIRST_AND_BEFORE = evisd.Settings(evidence_at="first", answer_at="tag")


def correct(adv, lp_s, lp_t, gen, kind, lam=0.2, tau=5.0, use_search=True, use_answer=True,
            keep_mask=None):
    """evisd.evisd_correction on the action spans of the kinds asked for (less ``keep_mask``),
    as correction_mask selects them, and the gap statistics the training log keeps."""
    mask = torch.zeros_like(gen, dtype=torch.bool)
    if use_search:
        mask |= kind == S
    if use_answer:
        mask |= kind == A_
    mask &= gen.bool()
    if keep_mask is not None:
        mask &= ~keep_mask
    out = evisd.evisd_correction(adv, lp_t - lp_s, gen, mask, lam, tau)
    return out, evisd.gap_stats(adv.detach(), (lp_t - lp_s).detach(), out, gen, kind)


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


def test_kind_switches_and_lambda_zero():
    kind, gen, _, lp_s, lp_t = _batch()
    adv = torch.tensor([1.0, -1.0])
    plain = adv[:, None].expand(2, 14) * gen
    out, _ = correct(adv, lp_s, lp_t, gen, kind, use_search=False)
    assert torch.equal(out[kind == S], plain[kind == S])
    assert not torch.equal(out[kind == A_], plain[kind == A_])
    out, _ = correct(adv, lp_s, lp_t, gen, kind, use_answer=False)
    assert torch.equal(out[kind == A_], plain[kind == A_])
    out, stats = correct(adv, lp_s, lp_t, gen, kind, lam=0.0)
    assert torch.equal(out, plain) and stats["modulated_frac"] == 0


def test_keep_mask_leaves_the_decision_tags_at_plain_a():
    kind, gen, _, lp_s, lp_t = _batch()
    adv = torch.tensor([1.0, -1.0])
    tags = torch.zeros_like(gen, dtype=torch.bool)
    tags[:, [4, 11]] = True                                        # the opening <search>, <answer>
    out, _ = correct(adv, lp_s, lp_t, gen, kind, keep_mask=tags)
    full, _ = correct(adv, lp_s, lp_t, gen, kind)
    assert torch.equal(out[tags], adv[:, None].expand(2, 14)[tags])
    # the content is corrected as before
    assert torch.equal(out[~tags], full[~tags])


def test_no_gradient_flows():
    kind, gen, _, lp_s, lp_t = _batch()
    lp_s.requires_grad_(True)
    lp_t.requires_grad_(True)
    out, _ = correct(torch.tensor([1.0, -1.0], requires_grad=True), lp_s, lp_t, gen, kind)
    assert not out.requires_grad


def test_gap_stats_by_sign():
    kind, gen, _, lp_s, _ = _batch()
    lp_t = lp_s.clone()
    lp_t[0] += 0.3                                                 # A > 0 episode: teacher +0.3
    lp_t[1] -= 1.0                                                 # A < 0 episode: teacher -1.0
    _, st = correct(torch.tensor([1.0, -1.0]), lp_s, lp_t, gen, kind)
    assert st["search_gap_pos"] == pytest.approx(0.3, abs=1e-5)
    assert st["answer_gap_neg"] == pytest.approx(-1.0, abs=1e-5)
    assert st["search_tokens"] == 6 and st["answer_tokens"] == 4


# ----------------------------------------------------------------------------- teacher context
@pytest.fixture(scope="module", params=["embedded", "pretrained-style"])
def setup(request):
    """An expert episode encoded by the embedded tokenizer (every tag one token) or by the
    pretrained-style stand-in of conftest.py (every tag several tokens)."""
    if request.param == "embedded":
        tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    else:
        tok = model.load_model(request.getfixturevalue("standin_dir"), local_files_only=True)[1]
    world = toy_world.make_world(seed=5, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                 n_companies=6)
    q = [q for q in world.split("train") if q.hops == 2][0]
    ep = toy_world.expert_episode(q, world)
    tr = model.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    return tok, world, q, tr


def test_teacher_context_placement(setup):
    tok, world, q, tr = setup
    ev, ans = evisd.privileged_ids(tok, q, world)
    assert tok.decode(ev) == search_env.format_information(world.evidence_docs(q))
    teacher, pos = evisd.insert_privileged(tr, ev, ans, FIRST_AND_BEFORE)
    s1 = next(s for s, _, k, _ in tr.spans if k == "search")
    sa = next(s for s, _, k, _ in tr.spans if k == "answer")
    # Nothing changes before the first search action: earlier tokens cannot see any block.
    assert teacher.ids[:s1] == tr.ids[:s1]
    # The evidence sits right before the first search, the golden answer right before the answer.
    assert teacher.ids[s1:s1 + len(ev)] == ev
    ta = next(s for s, _, k, _ in teacher.spans if k == "answer")
    assert teacher.ids[ta - len(ans):ta] == ans
    assert q.answers[0] in tok.decode(teacher.ids[ta - len(ans):ta])
    # The teacher scores exactly the student's tokens: the position map aligns them.
    for j, p in enumerate(pos):
        if p >= 0:
            assert teacher.ids[j] == tr.ids[p] and teacher.kind[j] == tr.kind[p]
    assert sum(p < 0 for p in pos) == len(ev) + len(ans)
    for (s, e, k, _), (ts, te, tk, _) in zip(tr.spans, teacher.spans):
        assert tr.ids[s:e] == teacher.ids[ts:te] and k == tk
    # Inserted tokens are not trained on.
    assert all(teacher.gen[j] == 0 and teacher.info[j] == 1 for j, p in enumerate(pos) if p < 0)


def test_teacher_answer_block_never_before_search(setup):
    tok, world, q, tr = setup
    ev, ans = evisd.privileged_ids(tok, q, world)
    teacher, _ = evisd.insert_privileged(tr, ev, ans, evisd.Settings(evidence=False), tok)
    last_search_end = max(e for _, e, k, _ in teacher.spans if k == "search")
    assert teacher.ids[:last_search_end] == tr.ids[:last_search_end]   # no block before searches
    assert len(teacher.ids) == len(tr.ids) + len(ans)


def _three_search_episode(tok, world):
    """Searches for both hops and one repeat, then the answer: three search spans."""
    q = [q for q in world.split("train") if q.hops == 2][0]
    env = search_env.SearchEnv(world, q, max_turns=4)
    turns = [f"<think> x. </think><search> {e} </search>"
             for e in q.hop_queries + q.hop_queries[:1]]
    turns.append(f"<think> y. </think><answer> {q.answers[0]} </answer>")
    observations = [env.step(t).observation for t in turns]
    return q, model.encode_episode(tok, model.render_prompt(tok, q), turns, observations)


def test_evidence_before_every_search_and_answer_block_after_the_tag(setup):
    tok, world, _, _ = setup
    q, tr = _three_search_episode(tok, world)
    ev, ans = evisd.privileged_ids(tok, q, world)
    every = evisd.Settings(evidence_at="every", answer_at="content")
    teacher, pos = evisd.insert_privileged(tr, ev, ans, every, tok)
    assert sum(p < 0 for p in pos) == 3 * len(ev) + len(ans)
    for s, e, k, _ in teacher.spans:
        # a block right before each search
        if k == "search":
            assert teacher.ids[s - len(ev):s] == ev
    (s, e), (s0, e0) = [(s, e) for t in (teacher, tr) for s, e, k, _ in t.spans if k == "answer"]
    cut = model.tag_length(tok, tr.ids[s0:e0], "answer")
    # the decision comes first,
    assert search_env.ANSWER in tok.decode(teacher.ids[s:s + cut])
    # then the golden answer
    assert teacher.ids[s + cut:s + cut + len(ans)] == ans
    kept = [teacher.ids[j] for j in range(s, e) if pos[j] >= 0]
    assert kept == tr.ids[s0:e0] and e - s == e0 - s0 + len(ans)   # the span holds its block
    # Aligned: every student token is scored where it sits in the teacher's sequence.
    assert all(teacher.ids[j] == tr.ids[p] and teacher.kind[j] == tr.kind[p]
               for j, p in enumerate(pos) if p >= 0)
    once, _ = evisd.insert_privileged(tr, ev, ans, FIRST_AND_BEFORE, tok)
    assert len(once.ids) == len(tr.ids) + len(ev) + len(ans)


def test_content_span_is_the_query_or_answer_between_the_tags(setup):
    tok, world, q, tr = setup
    b = model.collate([tr], tok.pad_token_id)
    r = model.Rollouts(**b, rewards=torch.tensor([1.0]), answers=[None], turns=torch.tensor([3]),
                       questions=[q])
    content = evisd.correction_mask(r, tok, evisd.Settings())[0]        # the paper's m
    action = evisd.correction_mask(r, tok, evisd.Settings(span="action"))[0]
    assert (content <= action).all() and content.sum() < action.sum()
    for s, e, k, turn in tr.spans:
        if k not in model.KIND_IDS:
            continue
        inside = content[s:e].nonzero().squeeze(1)
        first, last = int(inside[0]), int(inside[-1]) + 1
        assert content[s + first:s + last].all()                     # one run of tokens
        opening, closing = ((search_env.SEARCH, search_env.SEARCH_END) if k == "search"
                            else (search_env.ANSWER, search_env.ANSWER_END))
        # before it: the opening tag, completed by its last token; after it: the closing tag
        assert tok.decode(tr.ids[s:s + first]).rstrip().endswith(opening)
        assert closing in tok.decode(tr.ids[s + last:e])
        assert closing not in tok.decode(tr.ids[s:s + last])
        assert first == model.tag_length(tok, tr.ids[s:e], k)
        action_text = search_env.parse_action(tok.decode(tr.ids[s:e])).content
        assert tok.decode(tr.ids[s + first:s + last]).strip() == action_text


def test_teacher_logprobs_align_with_a_manual_forward(setup):
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    b = model.collate([tr, tr], tok.pad_token_id)
    r = model.Rollouts(**b, rewards=torch.tensor([1.0, 0.0]), answers=[None, None],
                   turns=torch.tensor([3, 3]), questions=[q, q])
    batch = evisd.teacher_batch(tok, world, r, [0, 1], FIRST_AND_BEFORE)
    lp_s = torch.full(r.input_ids.shape, -7.0)
    lp_t = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [0, 1], FIRST_AND_BEFORE)
    ev, ans = evisd.privileged_ids(tok, q, world)
    teacher, pos = evisd.insert_privileged(tr, ev, ans, FIRST_AND_BEFORE)
    full = model.token_logprobs(lm, torch.tensor([teacher.ids]),
                                torch.ones(1, len(teacher.ids), dtype=torch.long))[0]
    scored = (r.action_kind[0] > 0)
    assert scored.sum() > 0 and (lp_t[0][~scored] == -7.0).all()   # unscored: the student's value
    for j, p in enumerate(pos):
        if p >= 0 and scored[p]:
            assert lp_t[0, p].item() == pytest.approx(full[j].item(), abs=1e-5)
    assert torch.allclose(lp_t[0], lp_t[1])
    # only some episodes
    sub = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [1], FIRST_AND_BEFORE)
    assert torch.allclose(sub[1], lp_t[1], atol=1e-6) and (sub[0] == -7.0).all()
    # The teacher batch is cut after the last scored token.
    assert batch["input_ids"].shape[1] == max(j for j, p in enumerate(pos)
                                              if p >= 0 and scored[p]) + 1


def test_teacher_logprobs_selects_rows_and_scores_duplicates_once(setup, monkeypatch):
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    other = model.encode_episode(tok, model.render_prompt(tok, q), *_noisy_turns(world, q))
    b = model.collate([tr, other, tr, tr], tok.pad_token_id)
    r = model.Rollouts(**b, rewards=torch.zeros(4), answers=[None] * 4, turns=torch.full((4,), 3),
                   questions=[q] * 4)
    lp_s = torch.full(r.input_ids.shape, -7.0)
    settings = evisd.Settings()
    # Every row on its own, one teacher sequence each.
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


def _noisy_turns(world, q):
    import random
    for seed in range(50):
        ep = toy_world.expert_episode(q, world, noise=1.0, rng=random.Random(seed))
        if ep.turns[0].count("<search>") and ep.reward == 0:
            return ep.turns, ep.observations
    raise AssertionError("no noisy episode with a search")


def test_corrected_advantages_is_the_teacher_then_the_correction(setup):
    tok, world, q, tr = setup
    lm = model.build_model(tok, "tiny").eval()
    other = model.encode_episode(tok, model.render_prompt(tok, q), *_noisy_turns(world, q))
    b = model.collate([tr, other, tr, other], tok.pad_token_id)
    r = model.Rollouts(**b, rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), answers=[None] * 4,
                   turns=torch.full((4,), 3), questions=[q] * 4)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])        # the last two: A = 0, never re-scored
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask)
    cfg = dict(METHOD="evisd", USE_SEARCH_EVIDENCE=True, USE_ANSWER_PRIVILEGE=True,
               EVIDENCE_AT="every", ANSWER_AT="content", EVISD_SPAN="content",
               EVISD_LAMBDA=0.5, EVISD_TAU=2.0, TEMPERATURE=1.0)
    settings = train.evisd_settings(cfg)
    token_adv, lp_t = evisd.corrected_advantages(lm, tok, world, r, adv, lp_s, settings)
    expected_t = evisd.teacher_logprobs(lm, tok, world, r, lp_s, [0, 1], settings)
    assert torch.allclose(lp_t, expected_t) and torch.equal(lp_t[2:], lp_s[2:])
    tags = (evisd.correction_mask(r, tok, evisd.Settings(span="action"))
            & ~evisd.correction_mask(r, tok, settings))
    expected, _ = correct(adv, lp_s, expected_t, r.gen_mask, r.action_kind, lam=0.5, tau=2.0,
                          keep_mask=tags)
    assert torch.allclose(token_adv, expected)
    assert torch.equal(token_adv[tags], adv[:, None].expand_as(token_adv)[tags])   # the tags keep A
    assert not torch.equal(token_adv[:2], adv[:2, None] * r.gen_mask[:2])          # the rest moved
