"""EviSD: evidence-conditioned self-distillation as a bounded correction of GRPO advantages.

The student acted from the normal context. The *same* model, with no gradient, re-scores the
student's action tokens under a privileged, action-aligned context: the question's gold
evidence (formatted exactly like retrieved information) before each of its search actions, and
the golden answer inside its answer action, after the opening <answer> tag. The detached gap
between the two log-probs tells which action tokens the evidence makes more or less likely;
it rescales the GRPO advantage of those tokens within [1 - eps, 1 + eps], never changing the
sign the outcome reward chose (the RLSD form, arXiv 2604.03128):

    g_t = stopgrad(log p_teacher(y_t) - log p_student(y_t))     on action-span tokens
    w_t = clip(exp(sign(A) * g_t), 1 - eps, 1 + eps)
    Â_t = A * w_t

Thinking tokens keep A; retrieved information and the prompt are never trained on. Nothing
changes at inference time: the teacher exists only inside a training step.

The paper leaves three choices open; ``Privilege`` names them (train.py's EVIDENCE_AT,
ANSWER_AT, EVISD_SPAN) and docs/results-v2.md measures each: the evidence block before every search
or once before the first; the answer block after the opening <answer> tag (it informs only the
answer's content) or before it (it also informs the decision to answer, and approves answering
too early); and whether the opening tag itself, the decision to search or to answer, is
corrected or keeps the plain A.
"""
from dataclasses import dataclass

import torch

import model as M
import search_env as se
from model import KIND_IDS, Transcript, token_logprobs


# ----------------------------------------------------------------------------- the privileged context
def answer_block(answers):
    """The golden answer in a short block of the same style as retrieved information."""
    return f"{se.INFO} the answer is {answers[0]}. {se.INFO_END}"


def privileged_ids(tokenizer, question, world):
    """Token ids of the two privileged blocks of a question: (gold evidence, golden answer).
    A question without evidence (real data, real_data.EVIDENCE_RULES) gets no evidence block."""
    docs = world.evidence_docs(question)
    return (tokenizer.encode(se.format_information(docs), add_special_tokens=False) if docs else [],
            tokenizer.encode(answer_block(question.answers), add_special_tokens=False))


@dataclass(frozen=True)
class Privilege:
    """What the teacher reads, where, and which action tokens its gap may correct."""
    evidence: bool = True        # gold evidence before search actions (USE_SEARCH_EVIDENCE)
    answer: bool = True          # golden answer before the answer action (USE_ANSWER_PRIVILEGE)
    evidence_at: str = "every"   # "every": a block before each search | "first": one, before the first
    answer_at: str = "content"   # "content": right after the opening <answer> | "tag": before it
    span: str = "action"         # "action": tag and content corrected | "content": the tag keeps A

    @classmethod
    def from_config(cls, cfg):
        # A run saved before these constants existed placed its blocks the first way.
        return cls(cfg["USE_SEARCH_EVIDENCE"], cfg["USE_ANSWER_PRIVILEGE"], cfg.get("EVIDENCE_AT", "first"),
                   cfg.get("ANSWER_AT", "tag"), cfg.get("EVISD_SPAN", "action"))


def insert_privileged(tr, evidence_ids, answer_ids, privilege=Privilege(), tokenizer=None):
    """The teacher's transcript: ``tr`` with the privileged blocks inserted where ``privilege``
    says (``tokenizer`` finds the end of the opening <answer> tag for ANSWER_AT="content").

    One teacher sequence per episode is enough and cheapest: each block is inserted *before*
    the first action token it serves, so under causal attention no token before a block can see
    it (an earlier action's scores never depend on a later action's block), and with
    evidence_at="first" a later search sees the same evidence a per-action copy would give it,
    only further back.
    Returns (teacher Transcript, student_pos) where student_pos[j] is the student position of
    teacher token j, or -1 for an inserted token. Inserted tokens are marked as info.
    """
    inserts = {}
    searches = [s for s, _, k, _ in tr.spans if k == "search"]
    answer = next(((s, e) for s, e, k, _ in tr.spans if k == "answer"), None)
    if privilege.evidence and searches and evidence_ids:
        for s in searches if privilege.evidence_at == "every" else searches[:1]:
            inserts[s] = evidence_ids
    if privilege.answer and answer is not None and answer_ids:
        at = answer[0]
        if privilege.answer_at == "content":
            at += M.tag_length(tokenizer, tr.ids[answer[0]:answer[1]], "answer")
        inserts[at] = inserts.get(at, []) + answer_ids
    out = Transcript(tr.ids[:tr.prompt_len])
    student_pos = list(range(tr.prompt_len))
    prev = tr.prompt_len
    for cut in sorted(inserts) + [len(tr.ids)]:
        out.ids += tr.ids[prev:cut]
        out.gen += tr.gen[prev:cut]
        out.info += tr.info[prev:cut]
        out.kind += tr.kind[prev:cut]
        student_pos += range(prev, cut)
        if cut in inserts:
            out.add_observation(inserts[cut])
            student_pos += [-1] * len(inserts[cut])
        prev = cut
    # A span's start moves by the blocks at or before it, its end also by a block inside it.
    before = lambda pos, inclusive: sum(len(b) for p, b in inserts.items() if p < pos + inclusive)
    out.spans = [(s + before(s, 1), e + before(e, 0), k, i) for s, e, k, i in tr.spans]
    return out, student_pos


def _row(rollouts, i):
    """Episode i of a Rollouts batch as a Transcript (unpadded lists)."""
    n = int(rollouts.attention_mask[i].sum())
    tr = Transcript(rollouts.input_ids[i, :int(rollouts.prompt_len[i])].tolist())
    tr.ids = rollouts.input_ids[i, :n].tolist()
    tr.gen = rollouts.gen_mask[i, :n].tolist()
    tr.info = rollouts.info_mask[i, :n].tolist()
    tr.kind = rollouts.action_kind[i, :n].tolist()
    tr.spans = rollouts.spans[i]
    return tr


def teacher_inputs(rollouts, world, tokenizer, privilege=Privilege(), rows=None):
    """The teacher batch: one privileged sequence per episode (or per episode in ``rows``),
    right-padded.

    Returns a dict of [N, T'] tensors: input_ids, attention_mask, score_mask (1 on the
    teacher positions of the student's action tokens of the selected kinds) and student_pos
    (the student position of each teacher token, -1 where inserted or padding). Each sequence
    is cut after its last scored token: nothing after it can change a score.
    """
    kinds = [KIND_IDS["search"]] * privilege.evidence + [KIND_IDS["answer"]] * privilege.answer
    seqs, blocks = [], {}    # a group's episodes share one question: encode its blocks once
    for i in range(len(rollouts.questions)) if rows is None else rows:
        q = rollouts.questions[i]
        if q.qid not in blocks:
            blocks[q.qid] = privileged_ids(tokenizer, q, world)
        tr, pos = insert_privileged(_row(rollouts, i), *blocks[q.qid], privilege, tokenizer)
        score = [int(k in kinds) for k in tr.kind]
        last = max([j for j, s in enumerate(score) if s], default=0) + 1
        seqs.append((tr.ids[:last], score[:last], pos[:last]))
    T = max(len(s[0]) for s in seqs)

    def pad(values, fill):
        return torch.tensor([v + [fill] * (T - len(v)) for v in values], dtype=torch.long)

    return dict(input_ids=pad([s[0] for s in seqs], tokenizer.pad_token_id),
                attention_mask=pad([[1] * len(s[0]) for s in seqs], 0),
                score_mask=pad([s[1] for s in seqs], 0),
                student_pos=pad([s[2] for s in seqs], -1))


@torch.no_grad()
def teacher_logprobs(model, batch, logp_student, temperature=1.0):
    """Teacher log-probs of the student's action tokens, aligned to student positions [N, T].

    One batched no-grad forward; the output projection runs only at the scored positions.
    Positions the teacher does not score keep the student's log-prob (a zero gap).
    """
    device = next(model.parameters()).device
    b = {k: v.to(device) for k, v in batch.items()}
    lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["score_mask"],
                        temperature=temperature)                        # [N, T']
    out = logp_student.detach().float().clone().to(device)             # [N, T]
    rows, cols = b["score_mask"].nonzero(as_tuple=True)
    out[rows, b["student_pos"][rows, cols]] = lp[rows, cols]
    return out


def teacher_scores(model, rollouts, world, tokenizer, logp_student, rows, privilege=Privilege(),
                   temperature=1.0):
    """Teacher log-probs [N, T] for the episodes in ``rows`` (train.py passes those with A != 0,
    since A = 0 gives Â = 0 whatever the teacher says); all other positions keep the student's
    log-prob, a zero gap. Identical episodes of one question, frequent once a group agrees on
    its text, share one teacher sequence."""
    out = logp_student.detach().float().clone()
    copies = {}                                   # (question, token ids) -> episode indices
    for i in rows:
        n = int(rollouts.attention_mask[i].sum())
        copies.setdefault((rollouts.questions[i].qid, tuple(rollouts.input_ids[i, :n].tolist())), []).append(i)
    if not copies:
        return out
    groups = list(copies.values())
    first = [g[0] for g in groups]
    batch = teacher_inputs(rollouts, world, tokenizer, privilege, rows=first)
    scored = teacher_logprobs(model, batch, logp_student[first], temperature)   # [U, T]
    for g, row in zip(groups, scored):
        out[g] = row
    return out


# ----------------------------------------------------------------------------- the correction
@torch.no_grad()
def evisd_advantages(adv, logp_student, logp_teacher, gen_mask, action_kind, eps=0.2, tau=0.0,
                     use_search=True, use_answer=True, bounded=True, keep_mask=None):
    """Per-token advantages Â [N, T] from sequence advantages and the teacher-student gap.

    adv [N]; logp_student, logp_teacher, gen_mask, action_kind [N, T].
    On the selected action spans (action_kind 1 = search, 2 = answer):
        g = lp_teacher - lp_student;  w = clip(exp(sign(A) g), 1-eps, 1+eps);  Â = A w
    where |g| < tau counts as no signal (w = 1) and bounded=False drops the clip. Tokens in
    ``keep_mask`` [N, T] (the decision tags, for EVISD_SPAN="content") and every other generated
    token get the plain A; tokens off gen_mask get 0. The output has no gradient.
    Returns (token_adv, stats): stats has the fraction of generated tokens modulated (w != 1)
    and, per kind, the mean and max |g|, the mean w, and the mean g for A > 0 and A < 0.
    """
    gen = gen_mask.bool()
    selected = torch.zeros_like(gen)
    if use_search:
        selected |= action_kind == KIND_IDS["search"]
    if use_answer:
        selected |= action_kind == KIND_IDS["answer"]
    selected &= gen
    if keep_mask is not None:
        selected &= ~keep_mask.bool()
    A = adv.detach().float()[:, None].expand_as(logp_student)          # [N, T]
    gap = (logp_teacher - logp_student).detach().float()               # [N, T]
    w = torch.exp(torch.sign(A) * gap)
    if bounded:
        w = w.clamp(1.0 - eps, 1.0 + eps)
    w = torch.where(selected & (gap.abs() >= tau), w, torch.ones_like(w))
    token_adv = torch.where(gen, A * w, torch.zeros_like(A))
    stats = {"modulated_frac": ((w != 1) & gen).sum().item() / max(gen.sum().item(), 1)}
    for name, k in KIND_IDS.items():
        span = gen & (action_kind == k)
        g = gap[span]
        stats[f"{name}_tokens"] = int(span.sum())
        stats[f"{name}_gap_abs_mean"] = g.abs().mean().item() if g.numel() else 0.0
        stats[f"{name}_gap_abs_max"] = g.abs().max().item() if g.numel() else 0.0
        stats[f"{name}_w_mean"] = w[span].mean().item() if g.numel() else 1.0
        for sign, sel in (("pos", A > 0), ("neg", A < 0)):
            gs = gap[span & sel]
            stats[f"{name}_gap_{sign}"] = gs.mean().item() if gs.numel() else None
    return token_adv, stats


def decision_tags(rollouts, tokenizer):
    """[N, T] bool: the tokens of each action span that complete its opening tag, the decision
    to search or to answer (model.tag_length, as the rollout finds spans)."""
    mask = torch.zeros_like(rollouts.gen_mask, dtype=torch.bool)
    for i, spans in enumerate(rollouts.spans):
        for start, end, kind, _ in spans:
            if kind in KIND_IDS:
                ids = rollouts.input_ids[i, start:end].tolist()
                mask[i, start:start + M.tag_length(tokenizer, ids, kind)] = True
    return mask


def step_advantages(model, tokenizer, cfg, world, rollouts, adv, logp_student, rows=None):
    """The token advantages one training step computes from train.py's constants ``cfg``, the one
    function training, the report card (credit.py) and the preview (evaluate.py --show) call.
    GRPO: Â = A on every generated token, no teacher. EviSD: the teacher's log-probs on the
    episodes in ``rows`` (by default those with A != 0: A = 0 gives Â = 0 whatever the teacher
    says), then Â. Returns (token_adv [N, T], stats, logp_teacher [N, T]); where no teacher
    scored, logp_teacher is the student's (a zero gap)."""
    if cfg["METHOD"] == "grpo":
        gen = rollouts.gen_mask.to(adv.device)
        return adv[:, None] * gen, {}, logp_student.detach().float()
    privilege = Privilege.from_config(cfg)
    rows = adv.nonzero().squeeze(1).tolist() if rows is None else rows
    lp_teacher = teacher_scores(model, rollouts, world, tokenizer, logp_student, rows, privilege,
                                cfg["TEMPERATURE"])
    keep = decision_tags(rollouts, tokenizer).to(adv.device) if privilege.span == "content" else None
    token_adv, stats = evisd_advantages(
        adv, logp_student, lp_teacher, rollouts.gen_mask.to(adv.device), rollouts.action_kind.to(adv.device),
        cfg["EVISD_EPS"], cfg["EVISD_TAU"], privilege.evidence, privilege.answer, cfg["BOUNDED"], keep)
    return token_adv, stats, lp_teacher
