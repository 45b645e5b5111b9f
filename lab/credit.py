"""The credit-assignment lab: does the teacher's gap point the right way, and does each credit
rule put its credit where the oracle says it belongs?

EviSD corrects the advantage of each action content token by λ|A|·tanh(τg), with
g = log p_teacher − log p_student. Whatever the sign of A, that moves credit the right way
exactly when g > 0 on good actions and g < 0 on bad ones: a good search in a failed episode is
penalised less, a premature answer in a lucky one rewarded less. A synthetic world knows
which actions were good (the oracle, lab/oracle.py), so the teacher can be graded:

* ``action_records`` cuts every action of the scored episodes into its *decision tag* (the
  opening ``<search>``/``<answer>``: search now or answer now?) and its *content* (the query
  or the answer, with the closing tag), each with its oracle label, its mean gap and mean w;
* ``auc`` is the probability that a good action's gap exceeds a bad one's (0.5: the teacher
  knows nothing; 1.0: it separates them perfectly);
* ``misassigned_mass`` is the share of Σ|Â| over action tokens whose sign disagrees with the
  label, for GRPO (Â = A) and for EviSD on the same batch;
* ``report`` samples groups on held-out questions as training does and puts it all together;
  ``python lab/report.py RUN --credit`` prints it, and with ``--variants`` it grades every
  design choice of ``VARIANTS`` (where the teacher's blocks go, λ, ...) on the same samples;
* ``rules_report`` (``--credit --rules``) grades every credit rule of RULES (GRPO, EviSD and
  the peers' of lab/peers.py) on the same samples by its effective per-token advantage
  (``effective_advantages``): AUCs across and within episodes, misassigned mass, and how much
  credit lands where A = 0.

``show_episodes`` prints sampled episodes with each action token's gap (``--show``); ``main``
is what ``python lab/report.py RUN --credit`` and ``--show`` run.
"""
import json
import os
import sys
from collections import defaultdict

import torch
from tqdm import tqdm

import evaluate
import evisd
import grpo
import model
import rollout
import runs
import search_env
from lab import oracle, peers

PARTS = ("tag", "content")


def mean(values):
    return sum(values) / len(values)


# ----------------------------------------------------------------------------- labels
def episode_labels(rollouts, world, top_k):
    """The oracle labels of every episode of a Rollouts batch: a list (None where unknown)."""
    if rollouts.turn_texts is None:        # a batch built from transcripts, not played
        return [None] * len(rollouts.questions)
    return [oracle.oracle_labels(world, q, turns, top_k)
            for q, turns in zip(rollouts.questions, rollouts.turn_texts)]


# ----------------------------------------------------------------------------- the report card
def action_records(rollouts, labels, adv, gap, weight, rows):
    """One record per (action, part) of the episodes in ``rows``.

    adv [N]; gap, weight [N, T] (g and w per token). The decision tag is the action's tokens up
    to the one that completes the opening tag, as the rollout recorded it (rollout.Span: one
    token for the embedded tokenizer, several for a pretrained one); the content is the rest of
    the action, closing tag included. A tag is good when its decision was right, content when
    its label is in ``GOOD_LABELS``; a part whose label is None (real data) gets no record.
    """
    records = []
    for i in rows:
        if labels[i] is None:
            continue
        for span in rollouts.spans[i]:
            if span.kind not in rollout.KIND_IDS:
                continue
            lab, kind = labels[i][span.turn], span.kind
            start, cut, end = span.action, span.content_start, span.end
            for part, (a, b), good, name in (
                    ("tag", (start, cut), lab.decision_ok, "right" if lab.decision_ok else "wrong"),
                    ("content", (cut, end),
                     None if lab.label is None else lab.label in oracle.GOOD_LABELS, lab.label)):
                if b <= a or good is None:     # real data that cannot say: no record
                    continue
                records.append(dict(kind=kind, part=part, label=name, good=bool(good),
                                    sign=1 if adv[i] > 0 else -1, adv=float(adv[i]), episode=i,
                                    start=a, end=b, gap=gap[i, a:b].mean().item(),
                                    w=weight[i, a:b].mean().item()))
    return records


def auc(good, bad):
    """P(a good score > a bad one) + ½ P(tie): the Mann-Whitney U statistic over all pairs.
    None when either side is empty."""
    if not good or not bad:
        return None
    g, b = torch.tensor(good, dtype=torch.float64), torch.tensor(bad, dtype=torch.float64)
    greater = (g[:, None] > b[None, :]).double().mean()
    ties = (g[:, None] == b[None, :]).double().mean()
    return (greater + 0.5 * ties).item()


def misassigned_mass(token_adv, token_sign):
    """Share of Σ|Â| on labelled tokens whose sign disagrees with the label.

    token_adv [N, T]; token_sign [N, T]: +1 on good tokens, −1 on bad, 0 where unlabelled.
    None when no labelled token carries any advantage.
    """
    labelled = token_sign != 0
    total = token_adv.abs()[labelled].sum()
    wrong = token_adv.abs()[labelled & (torch.sign(token_adv) == -token_sign)].sum()
    return (wrong / total).item() if total > 0 else None


CELLS = ("all",) + tuple(f"{kind}_{part}" for kind in ("search", "answer") for part in PARTS)


def in_cell(records, cell):
    """The records of a cell of CELLS: all of them, or one (kind, part)."""
    return [r for r in records if cell in ("all", f"{r['kind']}_{r['part']}")]


def label_signs(records, shape):
    """{cell: token_sign [N, T]} for every cell of CELLS: +1 on the tokens of its good actions'
    parts, −1 on its bad ones', 0 elsewhere (``misassigned_mass``'s second argument)."""
    signs = {cell: torch.zeros(shape) for cell in CELLS}
    for r in records:
        for cell in ("all", f"{r['kind']}_{r['part']}"):
            signs[cell][r["episode"], r["start"]:r["end"]] = 1.0 if r["good"] else -1.0
    return signs


def summarise(records, adv, token_adv):
    """The report card from action records: table rows, AUCs and misassigned masses."""
    shape = token_adv.shape
    table = defaultdict(list)
    for r in records:
        table[(r["kind"], r["part"], r["label"], r["sign"])].append(r)
    order = lambda key: (key[0] != "search", PARTS.index(key[1]), key[2], -key[3])
    rows = [dict(kind=k, part=p, label=l, sign="A>0" if s > 0 else "A<0",
                 count=len(table[k, p, l, s]), gap=mean([r["gap"] for r in table[k, p, l, s]]),
                 w=mean([r["w"] for r in table[k, p, l, s]]))
            for k, p, l, s in sorted(table, key=order)]
    grpo_adv = adv[:, None].expand(shape)
    parts = {}
    for name, s in label_signs(records, shape).items():
        rs = in_cell(records, name)
        parts[name] = dict(
            actions=len(rs), good=sum(r["good"] for r in rs),
            auc=auc([r["gap"] for r in rs if r["good"]], [r["gap"] for r in rs if not r["good"]]),
            misassigned_grpo=misassigned_mass(grpo_adv, s),
            misassigned_evisd=misassigned_mass(token_adv, s))
    return {"rows": rows, "parts": parts}


# EviSD's open choices (train.py constants) as overrides of a run's config, scored on the same
# sampled batches by ``report(..., variants=...)``: the gap's AUC changes only with what the
# teacher reads and where; eps, the clip and the span change only how much of it reaches Â.
VARIANT_OVERRIDES = [
    {},
    {"EVIDENCE_AT": "first"}, {"EVIDENCE_AT": "every"},
    {"ANSWER_AT": "tag"}, {"ANSWER_AT": "content"},
    {"EVIDENCE_AT": "first", "ANSWER_AT": "tag"}, {"EVIDENCE_AT": "every", "ANSWER_AT": "content"},
    {"EVISD_LAMBDA": 0.1}, {"EVISD_LAMBDA": 0.5}, {"EVISD_TAU": 1.0},
    {"USE_ANSWER_PRIVILEGE": False}, {"USE_SEARCH_EVIDENCE": False},
    {"EVISD_SPAN": "action"},
    # the paper's ablation rows not above, and its λ dose (benchmark v5)
    {"EVISD_SPAN": "response"}, {"EVISD_FORM": "gated_loss", "EVISD_SPAN": "response"},
    {"TEACHER_CONTEXT": "shared"},
    {"EVISD_LAMBDA": 0.9},
]
VARIANTS = {(", ".join(f"{k}={v}" for k, v in o.items()) or "as configured"): o
            for o in VARIANT_OVERRIDES}


def sample(lm, tokenizer, cfg, world, questions, group_size):
    """Episodes of ``questions`` sampled as a training step samples them (Rollouts), their group
    advantages A [N] and the student's log-probs [N, T]."""
    envs = search_env.episodes(world, questions, group_size, cfg["MAX_TURNS"], cfg["TOP_K"])
    r = rollout.rollout(lm, tokenizer, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    adv = grpo.group_advantages(r.rewards, group_size)                          # [N]
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask,
                                    temperature=cfg["TEMPERATURE"])             # [N, T]
    return r, adv, lp_s


def batches(lm, tokenizer, cfg, sets, seed=0, progress=None):
    """The report card's batches: ``sets`` ([(world, questions)]) played world by world in
    chunks of QUESTIONS_PER_STEP, GROUP_SIZE samples at TEMPERATURE, exactly like training
    batches, each chunk under its own seed (so every mode of the card sees the same samples).
    Yields (world, rollouts, adv [N], student_logp [N, T], labels, offset), offset being the
    index of the batch's first episode once all batches are concatenated."""
    lm.eval()
    offset = 0
    for world, questions in sets:
        for c in range(0, len(questions), cfg["QUESTIONS_PER_STEP"]):
            chunk = questions[c:c + cfg["QUESTIONS_PER_STEP"]]
            torch.manual_seed(seed * 1_000_003 + offset)
            r, adv, lp_s = sample(lm, tokenizer, cfg, world, chunk, cfg["GROUP_SIZE"])
            yield world, r, adv, lp_s, episode_labels(r, world, cfg["TOP_K"]), offset
            offset += len(adv)
            if progress:
                progress(len(chunk))


def concat(tensors):
    """[N_i, T_i] tensors of successive batches as one [ΣN_i, max T_i], right-padded with 0."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])


def report(lm, tokenizer, cfg, sets, seed=0, progress=None, variants=None):
    """The report card on held-out questions ``sets`` ([(world, questions)], played as
    ``batches`` plays them). Returns a JSON-ready dict (see ``summarise``) with the label counts
    of the sampled actions; with ``variants`` ({name: config overrides}), one such dict per
    variant, all scored on the same sampled batches."""
    # The card grades EviSD's teacher, whichever method the run trained with.
    configs = {name: dict(cfg, METHOD="evisd", **overrides)
               for name, overrides in (variants or {"": {}}).items()}
    records = {name: [] for name in configs}
    token_advs = {name: [] for name in configs}
    labels_all, all_adv = [], []
    for world, r, adv, lp_s, labels, offset in batches(lm, tokenizer, cfg, sets, seed, progress):
        # What one training step computes: A, the student's log-probs, and per variant the
        # teacher's (on the episodes with A != 0) and Â.
        rows = adv.nonzero().squeeze(1).tolist()
        for name, vcfg in configs.items():
            token_adv, lp_t, _ = evisd.credit(lm, tokenizer, world, r, adv, lp_s, vcfg)
            w = token_adv / torch.where(adv == 0, 1.0, adv)[:, None]   # Â / A: EviSD's factor
            for rec in action_records(r, labels, adv, lp_t - lp_s, w, rows):
                rec["episode"] += offset    # index into the concatenated batch below
                records[name].append(rec)
            token_advs[name].append(token_adv)
        all_adv.append(adv)
        labels_all += labels
    adv = torch.cat(all_adv)
    cards = {}
    for name in configs:
        cards[name] = summarise(records[name], adv, concat(token_advs[name]))
        cards[name].update(episodes=len(adv), scored_episodes=int((adv != 0).sum()),
                           shares=oracle.label_shares(labels_all))
    return cards if variants else cards[""]


def variants_table(cards):
    """One row per variant: the AUC of the gap and the misassigned share of Σ|Â| (EviSD's; GRPO's
    in the first row), for all action tokens and the four (kind, part) cells."""
    cells = ("all", "search_tag", "search_content", "answer_tag", "answer_content")
    fmt = lambda v: "–" if v is None else f"{v:.3f}"
    first = next(iter(cards.values()))["parts"]
    lines = ["| variant | " + " | ".join(f"AUC {c}" for c in cells)
             + " | misassigned all | search content | answer tag |",
             "|---|" + "---|" * (len(cells) + 3),
             "| GRPO (Â = A) | " + " | ".join("–" for _ in cells) + " | "
             + " | ".join(fmt(first[c]["misassigned_grpo"])
                          for c in ("all", "search_content", "answer_tag")) + " |"]
    for name, card in cards.items():
        p = card["parts"]
        lines.append(f"| {name} | " + " | ".join(fmt(p[c]["auc"]) for c in cells) + " | "
                     + " | ".join(fmt(p[c]["misassigned_evisd"])
                                  for c in ("all", "search_content", "answer_tag")) + " |")
    return "\n".join(lines)


def format_report(card):
    """The report card as Markdown: one table of rows, one of AUCs and misassigned masses."""
    lines = [f"{card['episodes']} episodes, {card['scored_episodes']} with A != 0 (scored)",
             "", "| kind | part | label | A | actions | mean gap | mean w |",
             "|---|---|---|---|---|---|---|"]
    for r in card["rows"]:
        lines.append(f"| {r['kind']} | {r['part']} | {r['label']} | {r['sign']} | {r['count']} | "
                     f"{r['gap']:+.3f} | {r['w']:.3f} |")
    lines += ["", "| kind / part | actions (good) | AUC of gap | misassigned Σ|Â| GRPO | EviSD |",
              "|---|---|---|---|---|"]
    fmt = lambda v: "–" if v is None else f"{v:.3f}"
    for name, p in card["parts"].items():
        lines.append(f"| {name} | {p['actions']} ({p['good']}) | {fmt(p['auc'])} | "
                     f"{fmt(p['misassigned_grpo'])} | {fmt(p['misassigned_evisd'])} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- every rule
RULES = ("grpo", "evisd", "rlsd", "opsd", "sdar", "sd_search", "bicaa")


@torch.no_grad()
def sdar_effective(adv, gap, gen_mask, mask, lam=peers.SDAR_LAMBDA, beta=peers.SDAR_BETA):
    """SDAR's effective advantage [N, T]: the Â whose clipped surrogate alone has, at ratio 1,
    the gradient of SDAR's whole loss on each sampled token's log-prob.

    grpo.policy_loss gives ∂/∂logp_t = −Â_t / n_gen (n_gen: the batch's generated tokens), and
    peers.sdar_loss, a mean over the same tokens, −λ·σ(β·gap_t) / n_gen on m, 0 elsewhere.
    Their sum is the surrogate's with
        Â_eff = A + λ·σ(β·gap)   on m,   A on the other generated tokens:
    never below A (σ > 0), so where A = 0 it credits every m token, the teacher's favourites
    most."""
    gen, m = gen_mask.float(), mask.float()
    return adv.float()[:, None] * gen + lam * torch.sigmoid(beta * gap.float()) * m


def sd_search_effective(adv, gen_mask, queries, sampled, teacher_logits, student_logits,
                        alpha=peers.SD_SEARCH_ALPHA, top_k=peers.SD_SEARCH_TOP_K):
    """SD-Search's effective advantage [N, T], the sampled-token part of its JSD term.

    Its term α·mean JSD(teacher ‖ student) moves the whole next-token distribution at each
    query token, not one log-prob, so no Â reproduces it exactly. What the card grades is the
    push on the sampled token's logit u_y (logits over temperature, [M, V] in the row-major
    order of ``queries`` [N, T]; ``sampled`` [M] the tokens): the surrogate gives
    ∂/∂u_y = −Â·(1 − p_y) / n_gen, so Â_eff = A − n_gen·(∂term/∂u_y) / (1 − p_y) on the query
    tokens (by autograd), A on the other generated tokens. The term's pushes on the other
    logits are not graded, and a sampled token outside the teacher's top k gets no push."""
    out = adv.float()[:, None] * gen_mask.float()                    # [N, T]
    if teacher_logits is None:
        return out
    u = student_logits.detach().float().requires_grad_()            # [M, V]
    with torch.enable_grad():
        term = alpha * peers.top_k_jsd(teacher_logits.float(), u, top_k).mean()
        (grad,) = torch.autograd.grad(term, u)
    at = sampled[:, None]
    p = u.detach().softmax(-1).gather(-1, at).squeeze(-1)           # [M]
    push = -gen_mask.float().sum() * grad.gather(-1, at).squeeze(-1) / (1 - p).clamp(min=1e-6)
    out[queries.bool()] += push
    return out


def effective_advantages(lm, tokenizer, cfg, world, r, adv, lp_s):
    """{rule: Â_eff [N, T]} for every rule of RULES on one sampled batch (``sample``): GRPO's
    A on the generated tokens; EviSD's Â (evisd.credit); RLSD's, OPSD's and
    BiCAA's token advantages (peers.credit with METHOD set to the rule, at step 0: no rule reads
    the step today); SDAR's and SD-Search's, whose credit is a loss beside the surrogate, as
    ``sdar_effective`` and ``sd_search_effective`` turn it into Â. Each rule reads the run's
    teacher settings; all tensors come back on the CPU."""
    settings = dict(cfg, METHOD="evisd")
    out = {"grpo": adv[:, None] * r.gen_mask.float().to(adv.device)}
    out["evisd"], _, _ = evisd.credit(lm, tokenizer, world, r, adv, lp_s, settings)
    for rule in ("rlsd", "opsd", "bicaa", "sdar"):
        out[rule], lp_t, _ = peers.credit(dict(cfg, METHOD=rule), 0, lm, tokenizer, world, r,
                                          adv, lp_s)
    mask = evisd.correction_mask(r, settings)
    out["sdar"] = sdar_effective(adv, (lp_t - lp_s).cpu(), r.gen_mask, mask)   # SDAR's teacher
    # SD-Search's teacher and student next-token logits on the query tokens (as peers.credit).
    queries = mask & (r.action_kind == rollout.KIND_IDS["search"])
    device = next(lm.parameters()).device
    with torch.no_grad():
        teacher = peers.query_logits_teacher(lm, tokenizer, world, r, queries.to(device),
                                             settings)
        student = peers.next_token_logits(lm, r.input_ids.to(device),
                                          r.attention_mask.to(device), queries.to(device))
    T = cfg["TEMPERATURE"]
    out["sd_search"] = sd_search_effective(
        adv.cpu(), r.gen_mask, queries, r.input_ids[queries],
        None if teacher is None else teacher.cpu() / T, student.cpu() / T,
        peers.SD_SEARCH_ALPHA, peers.SD_SEARCH_TOP_K)
    return {rule: out[rule].float().cpu() for rule in RULES}


def within_episode_auc(records):
    """The AUC of the records' "score" over the pairs of a good and a bad action *of the same
    episode*: what a rule ranks inside an episode, where GRPO's A is one number (exactly 0.5
    for it). None when no episode has both."""
    episodes = defaultdict(lambda: ([], []))
    for r in records:
        episodes[r["episode"]][0 if r["good"] else 1].append(r["score"])
    pairs = [(auc(good, bad), len(good) * len(bad)) for good, bad in episodes.values()]
    n = sum(k for a, k in pairs if a is not None)
    return sum(a * k for a, k in pairs if a is not None) / n if n else None


SIGNS = {"pos": lambda a: a > 0, "neg": lambda a: a < 0, "zero": lambda a: a == 0}


def grade_rules(records, adv, effective):
    """Every rule's grades from one set of action records (all episodes, A = 0 too).

    adv [N]; effective {rule: Â_eff [N, T]}. Per rule and cell of CELLS, the score of an action
    part is its mean Â_eff: ``auc`` (good vs bad, across episodes: for GRPO, what outcome credit
    alone knows), ``within`` and ``within_pos`` / ``within_neg`` / ``within_zero``
    (``within_episode_auc`` over all episodes, those with A > 0, A < 0, A = 0) and
    ``misassigned`` (the share of Σ|Â_eff| on tokens whose sign disagrees with their label);
    per rule, ``zero_share``: the share of Σ|Â_eff| on labelled tokens that lies in episodes
    with A = 0, where GRPO gives nothing."""
    shape = next(iter(effective.values())).shape
    signs = label_signs(records, shape)
    labelled = signs["all"] != 0
    zero = (adv.cpu() == 0)[:, None] & labelled
    cards = {}
    for rule, token_adv in effective.items():
        # In float64 a constant part's mean is that constant exactly: GRPO's parts of one
        # episode tie (in float32 the rounding of a sum ranks them by length).
        scored = [dict(r, score=token_adv[r["episode"], r["start"]:r["end"]].double().mean()
                       .item()) for r in records]
        card = {}
        for cell in CELLS:
            rs = in_cell(scored, cell)
            card[cell] = dict(
                actions=len(rs),
                auc=auc([r["score"] for r in rs if r["good"]],
                        [r["score"] for r in rs if not r["good"]]),
                within=within_episode_auc(rs),
                misassigned=misassigned_mass(token_adv, signs[cell]))
            for name, keep in SIGNS.items():
                card[cell][f"within_{name}"] = within_episode_auc(
                    [r for r in rs if keep(r["adv"])])
        total = token_adv.abs()[labelled].sum()
        card["zero_share"] = (token_adv.abs()[zero].sum() / total).item() if total > 0 else None
        cards[rule] = card
    return cards


def rules_report(lm, tokenizer, cfg, sets, seed=0, progress=None):
    """Every rule of RULES on the same sampled batches (``batches``, the seeds of ``report``):
    {"rules": ``grade_rules``, episodes, zero_episodes (A = 0), shares}."""
    records, effective, all_adv, labels_all = [], defaultdict(list), [], []
    for world, r, adv, lp_s, labels, offset in batches(lm, tokenizer, cfg, sets, seed, progress):
        for rule, token_adv in effective_advantages(lm, tokenizer, cfg, world, r, adv,
                                                    lp_s).items():
            effective[rule].append(token_adv)
        # Every episode's actions, A = 0 too; the records' gap and w are not used here.
        zeros = torch.zeros(r.input_ids.shape)
        for rec in action_records(r, labels, adv, zeros, zeros, range(len(adv))):
            rec["episode"] += offset
            records.append(rec)
        all_adv.append(adv.cpu())
        labels_all += labels
    adv = torch.cat(all_adv)
    return dict(rules=grade_rules(records, adv, {k: concat(v) for k, v in effective.items()}),
                episodes=len(adv), zero_episodes=int((adv == 0).sum()),
                shares=oracle.label_shares(labels_all))


def rules_table(card):
    """Two Markdown tables, one row per rule: the grades on all action parts, then per cell its
    AUC across episodes, within them, and its misassigned share."""
    fmt = lambda v: "–" if v is None else f"{v:.3f}"
    lines = [f"{card['episodes']} episodes, {card['zero_episodes']} with A = 0", "",
             "| rule | AUC | within episode | within A>0 | within A<0 | within A=0 "
             "| misassigned Σ|Â| | Σ|Â| on A=0 |", "|---|" + "---|" * 7]
    for rule, g in card["rules"].items():
        a = g["all"]
        lines.append(f"| {rule} | " + " | ".join(fmt(a[k]) for k in (
            "auc", "within", "within_pos", "within_neg", "within_zero", "misassigned"))
            + f" | {fmt(g['zero_share'])} |")
    cells = CELLS[1:]
    lines += ["", "| rule (AUC / within / misassigned) | "
              + " | ".join(c.replace("_", " ") for c in cells) + " |",
              "|---|" + "---|" * len(cells)]
    for rule, g in card["rules"].items():
        lines.append(f"| {rule} | " + " | ".join(" / ".join(
            fmt(g[c][k]) for k in ("auc", "within", "misassigned")) for c in cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- episodes by gap
def printable(text):
    """``text`` as stdout can encode it: a lone surrogate or a character the terminal lacks
    becomes a backslash escape, so no model output can crash a print."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def show_episodes(lm, tok, cfg, world, qs, k):
    """Sample 4 episodes of each question in ``qs``, score them exactly as a training step would,
    and print two episodes of ``k`` questions with every action token's teacher-student gap
    (lab/report.py --show; the page of lab/credit_page.py shows every token): questions whose
    samples disagree first, since a group that agrees has A = 0, which training never asks the
    teacher about (its gap shows as 0)."""
    torch.manual_seed(0)
    r, adv, lp_s = sample(lm, tok, cfg, world, qs, 4)
    # The teacher's gap, whichever method the run trained with.
    _, lp_t, _ = evisd.credit(lm, tok, world, r, adv, lp_s, cfg)
    # stable
    groups = sorted(range(0, len(qs) * 4, 4), key=lambda i: not adv[i:i + 4].any())[:k]
    tty = sys.stdout.isatty()
    for i in groups:
        for j in (i, i + 1):   # two samples of each question
            n = int(r.attention_mask[j].sum())
            p = int(r.prompt_len[j])
            print("\n" + printable(f"Q: {r.questions[j].question}  gold={r.questions[j].answers[0]}"
                                   f"  reward={r.rewards[j]:.0f}  A={adv[j]:+.2f}"))
            text = []
            for t in range(p, n):
                piece = tok.decode([int(r.input_ids[j, t])])
                if r.info_mask[j, t]:
                    text.append("\x1b[2m" + piece + "\x1b[0m" if tty else piece)
                elif r.action_kind[j, t]:
                    g = (lp_t[j, t] - lp_s[j, t]).item()
                    colour = "32" if g > 0 else "31"
                    text.append(f"\x1b[{colour}m{piece}\x1b[0m[{g:+.1f}]" if tty
                                else f"{piece}[{g:+.1f}]")
                else:
                    text.append(piece)
            print(printable("".join(text)))


# ------------------------------------------------------------------- lab/report.py --credit, --show
def question_sets(cfg, n_questions, validation=False):
    """Held-out (or validation) `test` questions for the report card: a fixed sample, world by
    world; real data: a fixed sample of its dev (or validation) split."""
    if cfg["DATA"] != "toy":
        return [runs.lab("real_data", f"DATA={cfg['DATA']!r}")
                .questions(cfg, n_questions, validation)]
    sets, k = [], 0
    while n_questions > 0:
        world, qs = evaluate.heldout_questions(cfg, "test", n_questions, world_index=k,
                                               validation=validation)
        sets.append((world, qs))
        n_questions -= len(qs)
        k += 1
    return sets


def main(args):
    """``python lab/report.py RUN ... --credit [Q] [--variants | --rules] [--validation]`` or
    ``--show K``: the report card of each run (printed, and written as JSON: --json, or
    RUN/credit.json), or K groups of episodes."""
    if args.show:
        lm, tok, cfg, _ = runs.load_run(args.runs[0])
        # the groups with A != 0 are shown first
        world, qs = question_sets(cfg, 4 * args.show)[0]
        show_episodes(lm, tok, cfg, world, qs, args.show)
        return
    cards = {}
    for run in args.runs:
        lm, tok, cfg, _ = runs.load_run(run)
        sets = question_sets(cfg, args.credit, args.validation)
        with tqdm(total=args.credit, desc=f"credit {run}", dynamic_ncols=True) as bar:
            if getattr(args, "rules", False):
                cards[run] = rules_report(lm, tok, cfg, sets, progress=bar.update)
            else:
                cards[run] = report(lm, tok, cfg, sets, progress=bar.update,
                                    variants=VARIANTS if args.variants else None)
        table = (rules_table(cards[run]) if getattr(args, "rules", False)
                 else variants_table(cards[run]) if args.variants else format_report(cards[run]))
        print(f"\n## {run}\n\n{table}")
    out = args.json or os.path.join(args.runs[0], "credit.json")
    with open(out, "w") as f:
        json.dump(cards, f, indent=1)
    print("wrote", out)
