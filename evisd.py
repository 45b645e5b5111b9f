"""EviSD: evidence-conditioned self-distillation as a bounded correction of GRPO advantages.

The student acted from the normal context. The *same* model, with no gradient, re-scores the
student's own tokens as a privileged teacher, under an action-aligned context: a search action's
teacher reads the question's gold evidence (formatted exactly like retrieved information) and
never the golden answer; an answer action's teacher reads the golden answer and never the
evidence. The detached gap between the two log-probs says which tokens the privilege makes
more or less likely; it corrects the GRPO advantage of the content tokens of those actions by at
most lambda * |A|, so it never changes the sign the outcome reward chose and does nothing where
A = 0:

    delta_t = stopgrad(log p_teacher(y_t) - log p_student(y_t))
    Â_t     = A + lambda * |A| * m_t * tanh(tau * delta_t)        lambda = 0.2, tau = 5

m_t is 1 on the content tokens of generated search and answer actions (the query, the answer);
their tags, the thinking and the retrieved information keep the plain A (the last is never
trained on). This is the EviSD paper's rule (arXiv 2608.01359) as a detailed public summary of
it gives it, with its defaults; we have not seen the paper's own equation. Nothing changes at
inference time: the teacher exists only inside a training step.

Each row of the paper's ablation table is one field of ``Settings`` (train.py's EviSD block):
the span m covers (``span``), the form of credit (``form``: the bounded modulation or a gated
distillation loss), which actions are privileged (``evidence``, ``answer``) and whether each kind
reads its own block or one shared block (``context``). The peers' rules, which turn the same gap
into credit in other forms (RLSD, OPSD, SDAR, SD-Search, BiCAA), are in the lab: lab/peers.py.

Reading order: ``credit`` (what train.rl_step calls), then the teacher's context
(``teachers``, ``teacher_sequence``, ``teacher_logprobs``), then the formulas
(``evisd_correction``, ``gated_distillation_loss``).
"""
import dataclasses
from dataclasses import dataclass

import torch

from model import token_logprobs
from rollout import KIND_IDS, pad
from search_env import INFO, INFO_END, format_information


@dataclass(frozen=True)
class Settings:
    """EviSD's constants (train.py's EviSD block): what the teacher reads, where, and how its
    gap reaches the credit."""
    evidence: bool = True        # search actions read the gold evidence (USE_SEARCH_EVIDENCE)
    answer: bool = True          # the answer action reads the golden answer (USE_ANSWER_PRIVILEGE)
    context: str = "aligned"     # "aligned": each kind its own block | "shared": both, every action
    evidence_at: str = "every"   # "every": a block before each turn scored | "first": once
    answer_at: str = "content"   # "content": right after the opening <answer> | "tag": before it
    span: str = "content"        # m: "content" | "action" (and tags) | "response" (every token)
    form: str = "bounded"        # "bounded": modulate A | "gated_loss": A, plus a response loss
    lam: float = 0.2             # the bounded correction's bound, as a fraction of |A|
    tau: float = 5.0             # the gap's scale inside tanh (and inside the gated loss's gate)
    gate_coef: float = 0.01      # the gated loss's coefficient (EVISD_GATE_COEF)
    temperature: float = 1.0     # the teacher scores at the sampling temperature (TEMPERATURE)


def credit(policy, tokenizer, world, rollouts, adv, student_logp, settings):
    """EviSD's credit for one batch: the teacher's re-scoring, then the correction.

    adv [N] (grpo.group_advantages); student_logp [N, T], the policy's detached log-probs of the
    batch. Returns (token_adv [N, T], teacher_logp [N, T], extra_loss): where the teacher did not
    score, teacher_logp is the student's (a zero gap). The bounded form modulates A and adds no
    loss (extra_loss None); the gated loss keeps GRPO's A and returns
    ``extra_loss(policy, logp)``, the term train.rl_step adds to the policy loss.
    """
    if settings.form == "gated_loss":    # the paper's row is response-wide: every token is scored
        settings = dataclasses.replace(settings, span="response")
    device = adv.device
    gen_mask = rollouts.gen_mask.to(device)                           # [N, T]
    mask = correction_mask(rollouts, settings).to(device)             # m [N, T]
    if settings.form == "bounded":
        # A = 0 gives Â = 0 whatever the teacher says: only episodes with A != 0 are re-scored.
        rows = adv.nonzero().squeeze(1).tolist()
        teacher_logp = teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows,
                                        settings)
        token_adv = evisd_correction(adv, teacher_logp - student_logp, gen_mask, mask,
                                     settings.lam, settings.tau)
        return token_adv, teacher_logp, None
    # The gated loss acts where A = 0 too: every episode is re-scored.
    teacher_logp = teacher_logprobs(policy, tokenizer, world, rollouts, student_logp,
                                    list(range(len(adv))), settings)

    def extra_loss(policy, logp):
        return gated_distillation_loss(logp, teacher_logp, gen_mask, mask, settings.gate_coef,
                                       settings.tau)
    return adv[:, None] * gen_mask, teacher_logp, extra_loss


# ----------------------------------------------------------------------------- which tokens
def scored_range(span, setting):
    """The token range [lo, hi) of one turn (rollout.Span) that EVISD_SPAN ``setting`` covers:
    its content, its whole action (tags too), or the whole turn (thinking too)."""
    if setting == "content":
        return span.content_start, span.content_end
    if setting == "action":
        return span.action, span.end
    return span.start, span.end


def scored_turns(spans, settings):
    """(searching turns, answer turns): the turns of one episode (rollout.Span) a teacher scores.
    A kind that is not privileged (USE_SEARCH_EVIDENCE=False: the answer-only row) is neither
    scored nor corrected. Under the "response" span every generated turn is scored, invalid
    ones with the searches: a turn that does not answer is still looking for evidence."""
    searches = [s for s in spans if s.kind == "search"
                or (s.kind == "invalid" and settings.span == "response")]
    answers = [s for s in spans if s.kind == "answer"]
    return searches if settings.evidence else [], answers if settings.answer else []


def correction_mask(rollouts, settings):
    """m [N, T] bool: the generated tokens whose credit the gap may change, the scored range of
    every turn a teacher scores (``scored_turns``, ``scored_range``)."""
    mask = torch.zeros_like(rollouts.gen_mask, dtype=torch.bool)
    for i, spans in enumerate(rollouts.spans):
        for turns in scored_turns(spans, settings):
            for span in turns:
                lo, hi = scored_range(span, settings.span)
                mask[i, lo:hi] = True
    return mask & rollouts.gen_mask.bool()


# ----------------------------------------------------------------------------- teacher context
def privileged_ids(tokenizer, question, world):
    """Token ids of the two privileged blocks of a question: (gold evidence, golden answer), each
    formatted like retrieved information. A question without evidence (real data's EVIDENCE
    rules) gets no evidence block."""
    docs = world.evidence_docs(question)
    answer = f"{INFO} the answer is {question.answers[0]}. {INFO_END}"
    return (tokenizer.encode(format_information(docs), add_special_tokens=False) if docs else [],
            tokenizer.encode(answer, add_special_tokens=False))


def teachers(spans, evidence_ids, answer_ids, settings):
    """The teachers of one episode, as [(block ids, turns they score)].

    Aligned (the paper's default): the searching turns read the gold evidence, the answer turn
    the golden answer: two teacher sequences, so neither kind ever reads the other's block.
    Shared (the paper's -0.2 row): one sequence whose one block holds both, placed as each turn's
    own would be. A question without evidence (real data) has no evidence teacher.
    """
    searches, answers = scored_turns(spans, settings)
    searches = searches if evidence_ids else []
    if settings.context == "shared":
        block = ((evidence_ids if settings.evidence else [])
                 + (answer_ids if settings.answer else []))
        return [(block, sorted(searches + answers))]
    return [(evidence_ids, searches), (answer_ids, answers)]


def block_position(span, settings):
    """Where a turn's block goes: before the first token of the turn the teacher scores, so each
    scored token comes after the block its action is given. Under the "response" span that is
    the turn's start (its thinking is scored too: in the paper's per-action context the block
    precedes the whole action's turn); otherwise the opening tag, or, for the answer with
    ANSWER_AT="content", right after it (the block then informs the answer's content and not
    the decision to answer, which a golden answer would approve however early)."""
    if settings.span == "response":
        return span.start
    if span.kind == "answer" and settings.answer_at == "content":
        return span.content_start
    return span.action


def insert_blocks(ids, inserts):
    """``ids`` with blocks inserted: ``inserts`` maps a position to the ids placed right before
    the token there. Returns (ids, student_pos), student_pos[j] the position in ``ids`` of token
    j, -1 for an inserted one."""
    out, student_pos, prev = [], [], 0
    for cut in sorted(inserts) + [len(ids)]:
        out += ids[prev:cut]
        student_pos += range(prev, cut)
        if cut in inserts:
            out += inserts[cut]
            student_pos += [-1] * len(inserts[cut])
        prev = cut
    return out, student_pos


def teacher_sequence(ids, block, turns, settings):
    """One teacher's input for one episode: (ids, score, student_pos), lists of one length. The
    block goes before each turn in ``turns`` (EVIDENCE_AT="every") or before the first only;
    ``score`` is 1 on the scored tokens of ``turns``. The sequence is cut after its last scored
    token: nothing after it can change a score. None if it scores nothing.

    With "every", the k-th search reads k copies of the evidence, the nearest right before it: a
    per-action context would give it one copy, but one sequence per kind costs two forwards per
    episode instead of one per action, and a 4-layer model reads a block far back less well
    (search-content AUC 0.998 with a block before each search, 0.951 with one before the first:
    lab/results/results-v2.md). "first" gives every search exactly one copy, further back.
    """
    scored = {p for s in turns for p in range(*scored_range(s, settings.span))}
    if not scored:
        return None
    positions = [block_position(s, settings) for s in turns]
    positions = positions if settings.evidence_at == "every" else positions[:1]
    teacher, student_pos = insert_blocks(ids, {at: block for at in positions})
    score = [int(p in scored) for p in student_pos]
    last = max(j for j, s in enumerate(score) if s) + 1
    return teacher[:last], score[:last], student_pos[:last]


def teacher_batch(tokenizer, world, rollouts, rows, settings):
    """The teachers' inputs for the episodes ``rows``, right-padded (rollout.pad): [S, T'] tensors
    input_ids, attention_mask, score_mask (1 on the tokens it scores) and student_pos (each
    token's student position, -1 where inserted or padding), and owner [S] (each sequence's
    episode). Up to two sequences per episode (aligned), one if shared."""
    seqs, owner, blocks = [], [], {}   # a group's episodes share one question: encode once
    for i in rows:
        q = rollouts.questions[i]
        if q.qid not in blocks:
            blocks[q.qid] = privileged_ids(tokenizer, q, world)
        student = rollouts.input_ids[i, :int(rollouts.attention_mask[i].sum())].tolist()
        for block, turns in teachers(rollouts.spans[i], *blocks[q.qid], settings):
            seq = teacher_sequence(student, block, turns, settings)
            if seq is not None:
                seqs.append(seq)
                owner.append(i)
    return dict(input_ids=pad([s[0] for s in seqs], tokenizer.pad_token_id),
                attention_mask=pad([[1] * len(s[0]) for s in seqs], 0),
                score_mask=pad([s[1] for s in seqs], 0),
                student_pos=pad([s[2] for s in seqs], -1),
                owner=torch.tensor(owner, dtype=torch.long))


@torch.no_grad()
def teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows, settings):
    """The teacher's log-probs of the student's scored tokens in the episodes ``rows``, aligned
    to student positions: [N, T]. Every other position keeps the student's log-prob (a zero gap).

    One batched no-grad forward of the policy over the teacher sequences; the output projection
    runs only at the scored positions. Identical episodes of one question, frequent once a group
    agrees on its text, share their teacher sequences.
    """
    out = student_logp.detach().float().clone()                       # [N, T]
    copies = {}                                   # (question, token ids) -> episode indices
    for i in rows:
        n = int(rollouts.attention_mask[i].sum())
        key = (rollouts.questions[i].qid, tuple(rollouts.input_ids[i, :n].tolist()))
        copies.setdefault(key, []).append(i)
    firsts = [g[0] for g in copies.values()]
    batch = teacher_batch(tokenizer, world, rollouts, firsts, settings)
    if not len(batch["owner"]):
        return out
    batch = {k: v.to(out.device) for k, v in batch.items()}
    lp = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["score_mask"],
                        temperature=settings.temperature)             # [S, T']
    s, cols = batch["score_mask"].nonzero(as_tuple=True)
    # each scored token, back to its episode and its student position
    out[batch["owner"][s], batch["student_pos"][s, cols]] = lp[s, cols]
    for group in copies.values():
        out[group[1:]] = out[group[0]].clone()
    return out


# ----------------------------------------------------------------------------- the formulas
@torch.no_grad()
def evisd_correction(adv, gap, gen_mask, mask, lam=0.2, tau=5.0):
    """EviSD's per-token advantages Â [N, T] from sequence advantages and the teacher's gap.

    adv [N]; gap = logp_teacher - logp_student, gen_mask, mask (m) [N, T]. On generated tokens:
        Â = A + lam * |A| * m * tanh(tau * gap)
    so |Â - A| <= lam * |A|: the sign of A survives for lam < 1, A = 0 gives Â = 0, and a
    large gap saturates instead of dominating (tanh(5 * 0.2) = 0.76 already). Tokens off
    gen_mask get 0. No gradient flows through Â (the gap is detached).
    """
    A = adv.detach().float()[:, None].expand_as(gap)                  # [N, T]
    correction = lam * A.abs() * mask.float() * torch.tanh(tau * gap.detach().float())
    return torch.where(gen_mask.bool(), A + correction, torch.zeros_like(A))   # [N, T]


def gated_distillation_loss(logp, teacher_logp, gen_mask, mask, coef=0.01, tau=5.0):
    """The gated-loss row of the paper's ablation table, in our reading: plain GRPO advantages
    plus a response-wide auxiliary distillation term. The paper's summary names it only ("a
    response-wide gated auxiliary distillation loss"); we give it SDAR's form (arXiv 2605.15155,
    lab/peers.py) on every generated token, with EviSD's tau as the gate's sharpness:

        coef * sum_t m_t * sigmoid(tau * gap_t) * (logp_teacher_t - logp_t) / (generated tokens)

    gap_t = logp_teacher_t - logp_t, detached, so the gate says how much the teacher prefers
    the sampled token; the gradient flows through the student's ``logp`` [N, T] only: a push up
    on each sampled token, gate-weighted, -coef * sigmoid(tau * gap_t) / (generated tokens) per
    token. Unlike the bounded form it acts where A = 0 and is not tied to the outcome's sign.
    """
    gap = (teacher_logp - logp).detach()                              # [N, T]
    per_token = torch.sigmoid(tau * gap) * (teacher_logp.detach() - logp)
    return coef * (per_token * mask.float()).sum() / gen_mask.float().sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- what it did
@torch.no_grad()
def gap_stats(adv, gap, token_adv, gen_mask, action_kind):
    """What a correction did on a batch, for the training log: the fraction of generated tokens
    whose advantage it changed and, per action kind, the mean and max |g|, the mean w = Â / A
    (EviSD: 1 + lambda * tanh(tau * g) * sign(A) on content tokens), and the mean g on episodes
    with A > 0 and with A < 0."""
    gen = gen_mask.bool()
    A = adv.float()[:, None].expand_as(token_adv)
    w = torch.where(A != 0, token_adv / torch.where(A == 0, 1.0, A), torch.ones_like(A))
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
    return stats
