"""Tests for the credit-assignment lab: the report card's AUC and misassigned mass
(lab/credit.py) and every credit rule's effective advantage and grades (--credit --rules). The
oracle's labels it grades against: test_oracle.py."""
import json

import pytest
import torch

import grpo
import model
import rollout
import runs
import search_env
import toy_world
import train
from lab import credit, peers, report


@pytest.fixture(scope="module")
def world():
    return toy_world.make_world(seed=0)


def first(world, split, hops):
    return next(q for q in world.split(split) if q.hops == hops)


def test_auc():
    assert credit.auc([3.0, 2.0], [1.0, 0.0]) == 1.0
    assert credit.auc([0.0], [1.0, 2.0]) == 0.0
    assert credit.auc([1.0], [1.0]) == 0.5
    assert credit.auc([2.0, 0.0], [1.0]) == 0.5
    assert credit.auc([3.0, 1.0, 0.0], [2.0, -1.0]) == pytest.approx(4 / 6)
    assert credit.auc([], [1.0]) is None


def test_misassigned_mass():
    token_adv = torch.tensor([[1.0, 1.0, -2.0, 5.0], [-1.0, -3.0, 0.0, 0.0]])
    sign = torch.tensor([[1.0, -1.0, -1.0, 0.0], [1.0, -1.0, 1.0, 0.0]])
    # Labelled tokens carry |Â| 1, 1, 2, 1, 3, 0: the misassigned ones are the +1 on a bad token
    # and the −1 on a good one; the unlabelled 5 does not count.
    assert credit.misassigned_mass(token_adv, sign) == pytest.approx(2 / 8)
    assert credit.misassigned_mass(token_adv, torch.zeros_like(sign)) is None


def test_report_card_on_a_scripted_batch(world):
    """Two episodes of one 2-hop question: a clean success (A > 0) and a premature answer after
    a good first search (A < 0). A teacher whose gap is +1 on good parts and −1 on bad ones
    separates them perfectly (AUC 1) and lowers the misassigned mass below GRPO's."""
    q = first(world, "train", 2)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    good = toy_world.expert_episode(q, world)
    bad = toy_world.expert_episode(q, world, stop_early=1.0)
    trs = [rollout.encode_episode(tok, model.render_prompt(tok, q), e.turns, e.observations)
           for e in (good, bad)]
    r = rollout.Rollouts(**rollout.collate(trs, tok.pad_token_id), rewards=torch.tensor([1.0, 0.0]),
                       answers=[good.answer, bad.answer], turns=torch.tensor([3, 2]),
                       questions=[q, q], turn_texts=[good.turns, bad.turns])
    labs = credit.episode_labels(r, world, top_k=3)
    assert [a.label for a in labs[1]] == ["hit", "premature"]
    adv = torch.tensor([0.7, -0.7])
    gap = torch.zeros(r.input_ids.shape)
    records = credit.action_records(r, labs, adv, gap, torch.ones_like(gap), rows=[0, 1])
    # Each action is cut into a one-token tag and its content; 3 + 2 actions.
    assert [(x["kind"], x["part"], x["label"]) for x in records if x["episode"] == 1] == [
        ("search", "tag", "right"), ("search", "content", "hit"),
        ("answer", "tag", "wrong"), ("answer", "content", "premature")]
    assert all(x["end"] - x["start"] == 1 for x in records if x["part"] == "tag")
    for x in records:
        gap[x["episode"], x["start"]:x["end"]] = 1.0 if x["good"] else -1.0
    w = torch.exp(torch.sign(adv)[:, None] * gap).clamp(0.8, 1.2)
    token_adv = adv[:, None] * w * r.gen_mask
    card = credit.summarise(credit.action_records(r, labs, adv, gap, w, rows=[0, 1]),
                            adv, token_adv)
    assert card["parts"]["all"]["auc"] == 1.0
    assert card["parts"]["all"]["actions"] == 10 and card["parts"]["all"]["good"] == 8
    # Only the bad episode's good first search (its tag and its query) carries misassigned mass.
    tokens = lambda xs: sum(x["end"] - x["start"] for x in xs)
    good_search_of_bad = [x for x in records if x["episode"] == 1 and x["kind"] == "search"]
    assert card["parts"]["all"]["misassigned_grpo"] == pytest.approx(tokens(good_search_of_bad)
                                                                      / tokens(records))
    assert card["parts"]["all"]["misassigned_evisd"] < card["parts"]["all"]["misassigned_grpo"]
    row = next(x for x in card["rows"]
               if x["kind"] == "answer" and x["part"] == "tag" and x["label"] == "wrong")
    assert row == dict(kind="answer", part="tag", label="wrong", sign="A<0", count=1, gap=-1.0,
                       w=pytest.approx(1.2))
    assert "| answer | tag | wrong | A<0 | 1 | -1.000 | 1.200 |" in credit.format_report(
        dict(card, episodes=2, scored_episodes=2))


@pytest.mark.parametrize("tokenizer", ["embedded", "pretrained"])
def test_decision_tag_covers_exactly_the_opening_tag(world, tokenizer, request):
    """The tag part ends at the token that completes `<search>`/`<answer>`, whether the tag is
    one token (embedded) or several (the pretrained-style stand-in)."""
    tok = (model.build_tokenizer(model.tokenizer_texts(seeds=(0,))) if tokenizer == "embedded"
           else model.load_model(request.getfixturevalue("standin_dir"), local_files_only=True)[1])
    q = first(world, "train", 2)
    ep = toy_world.expert_episode(q, world)
    tr = rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    r = rollout.Rollouts(**rollout.collate([tr, tr], tok.pad_token_id),
                         rewards=torch.tensor([1.0, 0.0]), answers=[ep.answer] * 2,
                         turns=torch.tensor([3, 3]), questions=[q, q], turn_texts=[ep.turns] * 2)
    gap = torch.zeros(r.input_ids.shape)
    records = credit.action_records(r, credit.episode_labels(r, world, 3),
                                    torch.tensor([1.0, -1.0]), gap, torch.ones_like(gap),
                                    rows=[0])
    text = lambda x: tok.decode(r.input_ids[0, x["start"]:x["end"]].tolist())
    tags = [x for x in records if x["part"] == "tag"]
    assert [x["kind"] for x in tags] == ["search", "search", "answer"]
    for x in tags:
        opening = search_env.SEARCH if x["kind"] == "search" else search_env.ANSWER
        assert text(x).endswith(opening)                                  # the whole tag, no more
        assert opening not in tok.decode(r.input_ids[0, x["start"]:x["end"] - 1].tolist())
    if tokenizer == "pretrained":
        assert max(x["end"] - x["start"] for x in tags) > 1               # several tokens there


# ----------------------------------------------------------------------------- every rule (--rules)
def test_sdar_effective_advantage_gives_sdar_gradient():
    """At ratio 1, the surrogate with SDAR's Â_eff has the gradient on every sampled token's
    log-prob of the surrogate with A plus SDAR's loss (autograd on both)."""
    torch.manual_seed(0)
    adv = torch.tensor([1.0, -0.5, 0.0])
    gen = (torch.rand(3, 7) > 0.2).float()
    mask = (gen > 0) & (torch.rand(3, 7) > 0.5)
    old = -torch.rand(3, 7) * 3
    teacher = old + torch.randn(3, 7)
    logp = old.clone().requires_grad_()
    loss = (grpo.policy_loss(logp, old, None, adv[:, None] * gen, gen)[0]
            + peers.sdar_loss(logp, teacher, gen, mask))
    (want,) = torch.autograd.grad(loss, logp)
    eff = credit.sdar_effective(adv, teacher - old, gen, mask)
    (got,) = torch.autograd.grad(grpo.policy_loss(logp, old, None, eff, gen)[0], logp)
    assert torch.allclose(got, want, atol=1e-7)
    # A above A on m, where A = 0 too; plain A elsewhere; nothing off the generated tokens.
    plain = adv[:, None] * gen
    assert (eff[mask] > plain[mask]).all() and torch.equal(eff[~mask], plain[~mask])


def test_sd_search_effective_advantage_gives_the_sampled_logit_gradient():
    """On each sampled token's logit, the surrogate with SD-Search's Â_eff pushes as hard as the
    surrogate with A plus the JSD term (autograd on both); other logits are not matched."""
    torch.manual_seed(0)
    adv = torch.tensor([0.8, 0.0])
    gen = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]).float()
    queries = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]]).bool()
    M, V = int(queries.sum()), 12
    teacher, student = torch.randn(M, V) * 2, torch.randn(M, V) * 2
    sampled = torch.randint(V, (M,))
    eff = credit.sd_search_effective(adv, gen, queries, sampled, teacher, student, top_k=6)
    old = torch.full(gen.shape, -1.0)
    old[queries] = student.log_softmax(-1).gather(-1, sampled[:, None]).squeeze(-1)

    def sampled_grad(token_adv, with_term):
        u = student.clone().requires_grad_()
        logp = old.clone()
        logp[queries] = u.log_softmax(-1).gather(-1, sampled[:, None]).squeeze(-1)
        loss = grpo.policy_loss(logp, old, None, token_adv, gen)[0]
        if with_term:
            loss = loss + peers.SD_SEARCH_ALPHA * peers.top_k_jsd(teacher, u, 6).mean()
        (g,) = torch.autograd.grad(loss, u)
        return g.gather(-1, sampled[:, None]).squeeze(-1)
    want = sampled_grad(adv[:, None] * gen, True)
    assert torch.allclose(sampled_grad(eff, False), want, atol=1e-9)
    assert (eff[1][queries[1]] != 0).any()         # it acts where A = 0
    assert torch.equal(eff[~queries], (adv[:, None] * gen)[~queries])


@pytest.fixture(scope="module")
def scripted(world):
    """Episodes of one 2-hop question: [clean success, premature answer after a good search] x 2
    and the premature one 4 times more, its own group (rewards 1, 0, 1, 0 | 0, 0, 0, 0: the
    second group has A = 0); with the embedded tokenizer and a tiny random model."""
    q = first(world, "train", 2)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    eps = [toy_world.expert_episode(q, world, stop_early=s) for s in (0, 1, 0, 1, 1, 1, 1, 1)]
    trs = [rollout.encode_episode(tok, model.render_prompt(tok, q), e.turns, e.observations)
           for e in eps]
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0])
    r = rollout.Rollouts(**rollout.collate(trs, tok.pad_token_id), rewards=rewards,
                       answers=[e.answer for e in eps], turns=torch.tensor([len(e.turns)
                                                                            for e in eps]),
                       questions=[q] * 8, turn_texts=[e.turns for e in eps])
    torch.manual_seed(0)
    lm = model.build_model(tok, "tiny").eval()
    return lm, tok, r, grpo.group_advantages(rewards, 4)


def test_grades_of_grpo_and_of_a_rule_that_knows_the_labels(world, scripted):
    _, tok, r, _ = scripted
    adv = torch.tensor([0.7, -0.7, 0.7, 0.5, 0.0, 0.0, -0.3, -0.3])   # a bad episode with A > 0
    labs = credit.episode_labels(r, world, top_k=3)
    zeros = torch.zeros(r.input_ids.shape)
    records = credit.action_records(r, labs, adv, zeros, zeros, range(8))
    signs = credit.label_signs(records, zeros.shape)["all"]         # +1 good, -1 bad tokens
    cards = credit.grade_rules(records, adv, {"grpo": adv[:, None] * r.gen_mask,
                                              "oracle": signs * r.gen_mask})
    grpo_all, oracle = cards["grpo"]["all"], cards["oracle"]
    # A is one number per episode: GRPO ranks nothing inside one, whatever its sign.
    assert [grpo_all[k] for k in ("within", "within_pos", "within_neg", "within_zero")] == [0.5] * 4
    assert cards["grpo"]["zero_share"] == 0.0
    # Premature answers sit in episodes with A > 0 as well: across episodes GRPO does not
    # separate them, and it credits the good search of a failed episode negatively.
    assert 0.0 < grpo_all["auc"] < 1.0 and grpo_all["misassigned"] > 0
    # A rule whose credit is the label (±1) ranks every pair right, across episodes and within
    # them (only "all" has a good and a bad part in one episode: no single cell has).
    assert oracle["all"]["auc"] == oracle["all"]["within"] == 1.0
    assert oracle["all"]["within_zero"] == oracle["all"]["within_pos"] == 1.0
    assert all(oracle[cell]["auc"] in (1.0, None) and oracle[cell]["within"] is None
               for cell in credit.CELLS[1:])
    assert oracle["answer_content"]["auc"] == 1.0 and grpo_all["within_neg"] == 0.5
    assert oracle["all"]["misassigned"] == 0.0
    tokens = lambda rows: float((signs[rows] != 0).sum())
    assert oracle["zero_share"] == pytest.approx(tokens([4, 5]) / tokens(list(range(8))))
    table = credit.rules_table(dict(rules=cards, episodes=8, zero_episodes=2))
    assert "| grpo | " in table and "| oracle | " in table
    assert "| 0.500 | 0.500 | 0.500 | 0.500 |" in table.splitlines()[4]
    # its searches (all good): no AUC, no error; its answer content: AUC 1
    assert "| oracle | – / – / 0.000 | – / – / 0.000 | 1.000 / – / 0.000 | 1.000 / – / 0.000 |" \
        in table


def test_grpo_ties_within_an_episode_whatever_the_part_lengths():
    """A part's mean of a constant A is A exactly (in float32, 7 x 0.7 / 7 is not 0.7)."""
    records = [dict(kind="search", part="tag", good=True, adv=0.7, episode=0, start=0, end=1),
               dict(kind="search", part="content", good=False, adv=0.7, episode=0, start=1,
                    end=8)]
    cards = credit.grade_rules(records, torch.tensor([0.7]), {"grpo": torch.full((1, 8), 0.7)})
    assert cards["grpo"]["all"]["within"] == cards["grpo"]["all"]["auc"] == 0.5


def test_effective_advantages_of_every_rule_on_a_scripted_batch(world, scripted, monkeypatch):
    lm, tok, r, adv = scripted
    # A random model's top 50 next tokens rarely hold the scripted one (SD-Search's term then
    # does not push it): the whole vocabulary here.
    monkeypatch.setattr(peers, "SD_SEARCH_TOP_K", len(tok))
    cfg = dict(train.DEFAULTS, GROUP_SIZE=4, TEMPERATURE=1.0)
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask)
    eff = credit.effective_advantages(lm, tok, cfg, world, r, adv, lp_s)
    assert tuple(eff) == credit.RULES
    gen = r.gen_mask.bool()
    plain = adv[:, None] * r.gen_mask
    assert torch.equal(eff["grpo"], plain)
    zero = adv == 0
    assert zero[4:].all() and not zero[:4].any()
    for rule, token_adv in eff.items():
        assert token_adv.shape == r.input_ids.shape and torch.isfinite(token_adv).all()
        assert (token_adv[~gen] == 0).all(), rule
        # outcome-bound rules give nothing where A = 0; the others act there
        acts_at_zero = bool(token_adv[zero].abs().sum() > 0)
        assert acts_at_zero == (rule in ("opsd", "sdar", "sd_search", "bicaa")), rule
        if rule in ("evisd", "rlsd"):       # sign-preserving where A != 0
            assert (torch.sign(token_adv[gen]) == torch.sign(plain[gen])).all(), rule
    assert (eff["sdar"] >= plain).all()
    # The rules that act on m leave the tags (no m) at plain A.
    m = credit.evisd.correction_mask(r, cfg)
    for rule in ("evisd", "rlsd", "opsd", "sdar"):
        assert torch.equal(eff[rule][gen & ~m], plain[gen & ~m]), rule


def test_rules_mode_end_to_end_through_the_report(tmp_path, monkeypatch, capsys):
    """``lab/report.py RUN --credit 2 --rules``: a tiny random model samples, every rule is graded
    on the same batches, the table is printed and the JSON written."""
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    torch.manual_seed(0)
    lm = model.build_model(tok, "tiny")
    cfg = dict(train.DEFAULTS, QUESTIONS_PER_STEP=2, GROUP_SIZE=2, MAX_TURNS=2,
               MAX_NEW_TOKENS=12, WORLD_SCALE=0.3)
    monkeypatch.setattr(runs, "load_run", lambda run: (lm, tok, cfg, None))
    out = str(tmp_path / "rules.json")
    report.main([str(tmp_path), "--credit", "2", "--rules", "--json", out])
    card = json.load(open(out))[str(tmp_path)]
    assert list(card["rules"]) == list(credit.RULES) and card["episodes"] == 4
    assert set(card["rules"]["sdar"]) == set(credit.CELLS) | {"zero_share"}
    printed = capsys.readouterr().out
    assert all(f"| {rule} | " in printed for rule in credit.RULES)
    with pytest.raises(SystemExit, match="one at a time"):
        report.main([str(tmp_path), "--credit", "2", "--rules", "--variants"])
