"""Tests for lab/peers.py: each peer's rule on hand-made tensors (signs, bounds, the A = 0 case,
masks), and one step's credit for every METHOD on a tiny model."""
import math

import pytest
import torch

import evisd
import grpo
import model
import rollout
import toy_world
import train
from lab import peers

#                    prompt think  search   info   think  answer pad
GEN = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0]] * 2)
M = torch.tensor([[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0]] * 2).bool()   # content tokens


def gaps(seed=0, scale=1.0):
    torch.manual_seed(seed)
    return (torch.randn(2, 14) * scale)


def test_rlsd_is_the_multiplicative_clip():
    gap = gaps(scale=3.0)
    adv = torch.tensor([1.5, -0.5])
    out = peers.rlsd_advantages(adv, gap, GEN, M, eps=0.2)
    for i in range(2):
        for t in range(14):
            A = adv[i].item()
            if not GEN[i, t]:
                expected = 0.0
            elif M[i, t]:
                w = min(max(math.exp(math.copysign(1, A) * gap[i, t].item()), 0.8), 1.2)
                expected = A * w
            else:
                expected = A
            assert out[i, t].item() == pytest.approx(expected, rel=1e-5)
    on = GEN.bool()
    assert (torch.sign(out[on]) == torch.sign(adv[:, None].expand(2, 14)[on])).all()
    assert (peers.rlsd_advantages(torch.zeros(2), gap, GEN, M) == 0).all()       # A = 0
    # the authors' mix: halfway between plain A and the README's rule
    half = peers.rlsd_advantages(adv, gap, GEN, M, mix=0.5)
    plain = adv[:, None] * GEN
    assert torch.allclose(half, (plain + out) / 2)


def test_opsd_adds_the_gap_unbounded_and_acts_where_a_is_zero():
    gap = gaps(1, scale=3.0)
    adv = torch.tensor([0.3, 0.0])
    out = peers.opsd_advantages(adv, gap, GEN, M, coef=1.0)
    assert torch.allclose(out[M], (adv[:, None] + gap)[M])
    off = GEN.bool() & ~M
    assert torch.equal(out[off], adv[:, None].expand(2, 14)[off])
    assert (out[~GEN.bool()] == 0).all()
    assert (out[1][M[1]] != 0).all()                        # A = 0: the gap alone
    big = torch.full((2, 14), -5.0)
    assert (peers.opsd_advantages(adv, big, GEN, M)[0][M[0]] < 0).all()   # it flips A's sign


def test_sdar_loss_value_and_gradient():
    torch.manual_seed(2)
    logp = (-torch.rand(2, 14) * 3).requires_grad_(True)
    teacher = -torch.rand(2, 14) * 3
    lam, beta = 0.01, 5.0
    loss = peers.sdar_loss(logp, teacher, GEN, M, lam, beta)
    gate = torch.sigmoid(beta * (teacher - logp.detach()))
    n = GEN.sum()                                           # a mean over generated tokens
    assert loss.item() == pytest.approx((lam * (gate * (teacher - logp.detach()))[M].sum()
                                         / n).item(), rel=1e-5)
    loss.backward()
    # a gated push up on the sampled tokens of m, nothing elsewhere; the teacher gets none
    assert torch.allclose(logp.grad[M], -lam * gate[M] / n)
    assert (logp.grad[~M] == 0).all()


def test_top_k_jsd():
    torch.manual_seed(3)
    t, s = torch.randn(5, 30), torch.randn(5, 30)
    assert torch.allclose(peers.top_k_jsd(t, t.clone(), k=10), torch.zeros(5), atol=1e-6)
    full = peers.top_k_jsd(t, s, k=30)
    p, q = t.softmax(-1), s.softmax(-1)
    m = (p + q) / 2
    by_hand = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
    assert torch.allclose(full, by_hand, atol=1e-5)
    assert (full >= 0).all() and (full <= math.log(2) + 1e-6).all()
    # over the teacher's top 10 only: a token outside it does not count
    s2 = s.clone()
    outside = t.topk(30).indices[:, -1]
    s2[torch.arange(5), outside] += 10.0
    assert torch.allclose(peers.top_k_jsd(t, s, k=10), peers.top_k_jsd(t, s2, k=10))


def test_bicaa_turn_rewards():
    g = torch.tensor([[0.4, -0.4, float("nan")]])
    w = torch.tensor([[2.0, 2.0, 1.0]])
    r = peers.bicaa_turn_rewards(g, w)
    assert r[0, 0].item() == pytest.approx(0.8) and r[0, 1].item() == pytest.approx(-0.2)
    assert math.isnan(r[0, 2].item())


def test_bicaa_advantages_by_hand():
    # one group of two episodes; episode 0 has turns 0 and 1, episode 1 turn 0 only
    rewards = torch.tensor([[1.0, 3.0], [2.0, float("nan")]])
    turn = torch.full((2, 14), -1)
    turn[:, 2:7] = 0
    turn[0, 9:13] = 1
    gen = GEN.clone()
    gen[1, 9:13] = 0
    adv = torch.tensor([0.0, 0.0])                          # a tied group: BiCAA still acts
    out = peers.bicaa_advantages(adv, rewards, turn, gen, M, group_size=2, alpha=0.25, gamma=1.0)
    z = (torch.tensor([1.0, 3.0, 2.0]) - 2.0) / (1.0 + 1e-4)   # mean 2, unbiased std 1
    to_go_00 = z[0] + z[1]                                  # turn 0 of episode 0: both turns
    assert out[0, 5].item() == pytest.approx(0.25 * to_go_00.item(), abs=1e-5)
    assert out[0, 12].item() == pytest.approx(0.25 * z[1].item(), abs=1e-5)
    assert out[1, 5].item() == pytest.approx(0.25 * z[2].item(), abs=1e-5)
    assert out[0, 3].item() == 0.0                          # off m: plain A
    assert (out[~gen.bool()] == 0).all()


def test_sd_search_loss_is_the_mean_jsd_over_query_tokens():
    torch.manual_seed(4)
    t, s = torch.randn(6, 40), torch.randn(6, 40)
    loss = peers.sd_search_loss(t, s, temperature=0.5, alpha=0.1)
    per_token = [peers.top_k_jsd(t[j:j + 1] / 0.5, s[j:j + 1] / 0.5).item() for j in range(6)]
    assert loss.item() == pytest.approx(0.1 * sum(per_token) / 6, rel=1e-5)


def test_turn_criticality_by_hand():
    """w_k = geometric-mean probability of turn k's m tokens under the teacher, over the
    episode's mean of it, clipped to BICAA_CLIP; 1 for a turn with no m token."""
    lp = torch.full((2, 12), -9.0)          # off m: values that must not count
    turn = torch.full((2, 12), -1)
    m = torch.zeros(2, 12, dtype=torch.bool)
    # episode 0: turns 0 (m at 1, 2), 1 (m at 5), 2 (no m token)
    turn[0, 0:3], turn[0, 4:7], turn[0, 8:10] = 0, 1, 2
    m[0, [1, 2, 5]] = True
    lp[0, 1], lp[0, 2], lp[0, 5] = -0.2, -0.4, -1.0
    # episode 1: turns 0, 1, 2 with one m token each; the middle one far more likely
    turn[1, 0:2], turn[1, 3:5], turn[1, 6:8] = 0, 1, 2
    m[1, [1, 4, 7]] = True
    lp[1, 1], lp[1, 4], lp[1, 7] = -3.0, -0.05, -3.0
    w = peers.turn_criticality(lp, m, turn, 3)

    def by_hand(values):
        mean = sum(values) / len(values)
        return [min(max(v / mean, peers.BICAA_CLIP[0]), peers.BICAA_CLIP[1]) for v in values]
    g0 = [math.exp((-0.2 - 0.4) / 2), math.exp(-1.0)]
    g1 = [math.exp(-3.0), math.exp(-0.05), math.exp(-3.0)]
    assert w[0].tolist() == pytest.approx(by_hand(g0) + [1.0], rel=1e-5)
    assert w[1].tolist() == pytest.approx(by_hand(g1), rel=1e-5)
    assert w[1, 1].item() == peers.BICAA_CLIP[1] and w[1, 0].item() == peers.BICAA_CLIP[0]
    assert peers.BICAA_CLIP[0] < w[0, 0].item() < peers.BICAA_CLIP[1]


@pytest.mark.parametrize("rule", [peers.rlsd_advantages, peers.opsd_advantages, peers.sdar_loss,
                                  peers.sd_search_loss, peers.bicaa_advantages])
def test_every_rule_says_where_it_departs_from_its_paper(rule):
    assert "\n    ours: " in rule.__doc__


def test_turn_runs():
    assert peers.turn_runs([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]
    assert peers.turn_runs([0, 0]) == []


# ----------------------------------------------------------------------------- one step, each rule
@pytest.fixture(scope="module")
def step_inputs():
    """A tiny random model and a batch of four episodes (two expert, two noisy) of one
    question, with the GRPO advantages of rewards 1, 0, 1, 0."""
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    lm = model.build_model(tok, "tiny").eval()
    world = toy_world.make_world(seed=5, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                 n_companies=6)
    q = [q for q in world.split("train") if q.hops == 2][0]
    good = toy_world.expert_episode(q, world)
    bad = toy_world.expert_episode(q, world, stop_early=1.0)
    trs = [rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
           for ep in (good, bad, good, bad)]
    b = rollout.collate(trs, tok.pad_token_id)
    r = rollout.Rollouts(**b, rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), answers=[None] * 4,
                       turns=torch.tensor([len(t.spans) for t in trs]), questions=[q] * 4,
                       turn_texts=[good.turns, bad.turns, good.turns, bad.turns])
    adv = grpo.group_advantages(r.rewards, 4)
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask)
    return lm, tok, world, r, adv, lp_s


@pytest.mark.parametrize("method", train.PEERS)
def test_credit_for_every_peer(step_inputs, method):
    """One step's credit is the rule's formula on EviSD's teacher: the teacher's log-probs on
    the rows the rule needs, its gap (teacher minus student) and m (evisd.correction_mask)."""
    lm, tok, world, r, adv, lp_s = step_inputs
    cfg = dict(train.DEFAULTS, METHOD=method, GROUP_SIZE=4, TEMPERATURE=1.0)
    token_adv, lp_t, extra_loss = peers.credit(cfg, 0, lm, tok, world, r, adv, lp_s)
    assert token_adv.shape == lp_t.shape == r.input_ids.shape
    assert (token_adv[r.gen_mask == 0] == 0).all() and torch.isfinite(token_adv).all()
    settings = cfg
    m, gen = evisd.correction_mask(r, settings), r.gen_mask
    rows = [0, 1, 2, 3] if method != "rlsd" else adv.nonzero().squeeze(1).tolist()
    assert torch.allclose(lp_t, evisd.teacher_logprobs(lm, tok, world, r, lp_s, rows, settings))
    assert not torch.equal(lp_t, lp_s)                      # the teacher scored something
    gap = lp_t - lp_s
    plain = adv[:, None] * gen
    logp = model.token_logprobs(lm, r.input_ids, r.attention_mask, gen)
    if method == "rlsd":
        expected = peers.rlsd_advantages(adv, gap, gen, m)
    elif method == "opsd":
        expected = peers.opsd_advantages(adv, gap, gen, m)
    elif method == "bicaa":
        gains, turn = peers.answer_gains(lm, tok, r, temperature=1.0)
        w = peers.turn_criticality(lp_t, m, turn, gains.shape[1])
        expected = peers.bicaa_advantages(adv, peers.bicaa_turn_rewards(gains, w), turn, gen, m, 4)
    else:                                                   # A untouched, a loss beside it
        expected = plain
        extra = extra_loss(lm, logp)
        if method == "sdar":
            assert extra.item() == pytest.approx(peers.sdar_loss(logp, lp_t, gen, m).item())
        else:
            queries = m & (r.action_kind == rollout.KIND_IDS["search"])
            teacher = peers.query_logits_teacher(lm, tok, world, r, queries, settings)
            student = peers.next_token_logits(lm, r.input_ids, r.attention_mask, queries)
            assert extra.item() == pytest.approx(peers.sd_search_loss(teacher, student, 1.0).item())
        assert extra.requires_grad and extra.item() != 0
    assert torch.allclose(token_adv, expected)
    assert (extra_loss is None) == (method not in ("sdar", "sd_search"))
    assert torch.equal(token_adv, plain) == (method in ("sdar", "sd_search"))


def test_sd_search_aligns_teacher_and_student_positions(step_inputs):
    """Row k of the teacher's and of the student's query logits predicts the same sampled
    token: the k-th query token in row-major order, read at its own position in the student's
    sequence and at the position the evidence moved it to in the teacher's."""
    lm, tok, world, r, adv, lp_s = step_inputs
    settings = dict(train.DEFAULTS, TEMPERATURE=1.0)
    queries = evisd.correction_mask(r, settings) & (r.action_kind == rollout.KIND_IDS["search"])
    known = [(i, t) for i, spans in enumerate(r.spans) for s in spans if s.kind == "search"
             for t in range(s.content_start, s.content_end)]
    assert [tuple(p) for p in queries.nonzero().tolist()] == known and known
    teacher = peers.query_logits_teacher(lm, tok, world, r, queries, settings)
    student = peers.next_token_logits(lm, r.input_ids, r.attention_mask, queries)
    assert teacher.shape == student.shape == (len(known), lm.config.vocab_size)
    batch = evisd.teacher_batch(tok, world, r, sorted({i for i, _ in known}), settings)
    with torch.no_grad():
        t_logits = lm(input_ids=batch["input_ids"],
                      attention_mask=batch["attention_mask"]).logits          # [S, T', V]
        s_logits = lm(input_ids=r.input_ids, attention_mask=r.attention_mask).logits
    for k, (i, t) in enumerate(known):
        # the one teacher position that scores student position t of episode i
        (u, j), = [(u, j) for u in range(len(batch["owner"])) if batch["owner"][u] == i
                   for j in range(batch["student_pos"].shape[1])
                   if batch["student_pos"][u, j] == t and batch["score_mask"][u, j]]
        assert batch["input_ids"][u, j] == r.input_ids[i, t]
        assert j > t                                        # the evidence came before it
        assert torch.allclose(teacher[k], t_logits[u, j - 1].float(), atol=1e-5)
        assert torch.allclose(student[k], s_logits[i, t - 1].float(), atol=1e-5)


def test_answer_gains_match_a_manual_forward(step_inputs):
    lm, tok, world, r, adv, lp_s = step_inputs
    gains, turn_of_token = peers.answer_gains(lm, tok, r, temperature=1.0)
    n_turns = [len(peers.turn_runs(r.gen_mask[i].tolist())) for i in range(4)]
    assert gains.shape == (4, max(n_turns))
    for i in range(4):
        assert not torch.isnan(gains[i, :n_turns[i]]).any()
        assert torch.isnan(gains[i, n_turns[i]:]).all()
        assert int(turn_of_token[i].max()) == n_turns[i] - 1
    # L_0 and L_1 of episode 0 by hand: the golden answer's token-mean log-prob after the prompt
    # and after the first turn with its observation
    answer = tok.encode(f" {r.questions[0].answers[0]} ", add_special_tokens=False)
    opening, closing = (tok.encode(t, add_special_tokens=False) for t in ("<answer>", "</answer>"))
    start_2nd = peers.turn_runs(r.gen_mask[0].tolist())[1][0]
    L = []
    for end in (int(r.prompt_len[0]), start_2nd):
        ids = torch.tensor([r.input_ids[0, :end].tolist() + opening + answer + closing])
        score = torch.zeros_like(ids)
        score[0, end + len(opening):end + len(opening) + len(answer)] = 1
        with torch.no_grad():
            lp = model.token_logprobs(lm, ids, torch.ones_like(ids), score)
        L.append((lp.sum() / len(answer)).item())
    assert gains[0, 0].item() == pytest.approx(L[1] - L[0], abs=1e-4)
