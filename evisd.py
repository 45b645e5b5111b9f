"""EviSD: evidence-conditioned self-distillation as a bounded correction of GRPO advantages.

The student acted from the normal context. The *same* model, with no gradient, re-scores the
student's action tokens under a privileged, action-aligned context: the question's gold
evidence (formatted exactly like retrieved information) before each of its search actions, and
the golden answer inside its answer action, after the opening <answer> tag. The detached gap
between the two log-probs tells which action tokens the evidence makes more or less likely;
it corrects the GRPO advantage of the content tokens of those actions by at most lambda * |A|,
so it never changes the sign the outcome reward chose and does nothing where A = 0:

    delta_t = stopgrad(log p_teacher(y_t) - log p_student(y_t))
    Â_t     = A + lambda * |A| * m_t * tanh(tau * delta_t)        lambda = 0.2, tau = 5

m_t is 1 on the content tokens of generated search and answer actions (the query, the answer);
their tags, the thinking and the retrieved information keep the plain A (the last is never
trained on). This is the EviSD paper's rule (arXiv 2608.01359) as a detailed public summary of
it gives it, with its defaults; we have not seen the paper's own equation. Nothing changes at
inference time: the teacher exists only inside a training step. Its peers' rules, which turn
the same gap into credit in other forms (RLSD, OPSD, SDAR, SD-Search, BiCAA), are in the lab:
lab/peers.py.

The paper leaves three choices open; ``Settings`` names them (train.py's EVIDENCE_AT,
ANSWER_AT, EVISD_SPAN) and lab/results/results-v2.md measures the first two: the evidence
block before every search or once before the first; the answer block after the opening
<answer> tag (it informs only the answer's content) or before it (it also informs the decision
to answer, and approves answering too early); and whether the tags (the decision to search or
to answer) are corrected too, as this code did before the paper's rule (benchmarks v1-v3).

Reading order: ``corrected_advantages`` (what train.rl_step calls), then the teacher's context
(``insert_privileged``, ``teacher_logprobs``), then the formula (``evisd_correction``).
"""
from dataclasses import dataclass

import torch

from model import KIND_IDS, Transcript, tag_length, token_at, token_logprobs
from search_env import (ANSWER, ANSWER_END, INFO, INFO_END, SEARCH, SEARCH_END,
                        format_information)


@dataclass(frozen=True)
class Settings:
    """EviSD's constants (train.py's EviSD block): what the teacher reads, where, and how its
    gap reaches the advantage."""
    evidence: bool = True        # gold evidence before search actions (USE_SEARCH_EVIDENCE)
    answer: bool = True          # golden answer before the answer action (USE_ANSWER_PRIVILEGE)
    evidence_at: str = "every"   # "every": a block before each search | "first": once, before it
    answer_at: str = "content"   # "content": right after the opening <answer> | "tag": before it
    span: str = "content"        # "content": query/answer tokens | "action": with both tags
    lam: float = 0.2             # the correction's bound, as a fraction of |A| (EVISD_LAMBDA)
    tau: float = 5.0             # the gap's scale inside tanh (EVISD_TAU)
    temperature: float = 1.0     # the teacher scores at the sampling temperature (TEMPERATURE)


def corrected_advantages(policy, tokenizer, world, rollouts, adv, student_logp, settings):
    """EviSD's token advantages for one batch: the teacher's re-scoring, then the correction.

    adv [N] (grpo.group_advantages); student_logp [N, T], the policy's detached log-probs of the
    batch. Returns (token_adv [N, T], teacher_logp [N, T]); where the teacher did not score,
    teacher_logp is the student's (a zero gap).
    """
    # A = 0 gives Â = 0 whatever the teacher says: only episodes with A != 0 are re-scored.
    rows = adv.nonzero().squeeze(1).tolist()
    teacher_logp = teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows,
                                    settings)
    device = adv.device
    token_adv = evisd_correction(adv, teacher_logp - student_logp, rollouts.gen_mask.to(device),
                                 correction_mask(rollouts, tokenizer, settings).to(device),
                                 settings.lam, settings.tau)
    return token_adv, teacher_logp


# ----------------------------------------------------------------------------- privileged context
def answer_block(answers):
    """The golden answer in a short block of the same style as retrieved information."""
    return f"{INFO} the answer is {answers[0]}. {INFO_END}"


def privileged_ids(tokenizer, question, world):
    """Token ids of the two privileged blocks of a question: (gold evidence, golden answer).
    A question without evidence (real data's EVIDENCE rules) gets no evidence block."""
    docs = world.evidence_docs(question)
    return (tokenizer.encode(format_information(docs), add_special_tokens=False) if docs else [],
            tokenizer.encode(answer_block(question.answers), add_special_tokens=False))


def insert_privileged(tr, evidence_ids, answer_ids, settings, tokenizer=None):
    """The teacher's transcript: ``tr`` with the privileged blocks inserted where ``settings``
    says (``tokenizer`` finds the end of the opening <answer> tag for answer_at="content").

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
    if settings.evidence and searches and evidence_ids:
        for s in searches if settings.evidence_at == "every" else searches[:1]:
            inserts[s] = evidence_ids
    if settings.answer and answer is not None and answer_ids:
        at = answer[0]
        if settings.answer_at == "content":
            at += tag_length(tokenizer, tr.ids[answer[0]:answer[1]], "answer")
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

    def shift(pos, inclusive):
        """How far the blocks inserted before ``pos`` (or at it, when inclusive) move it."""
        return sum(len(block) for at, block in inserts.items() if at < pos + inclusive)

    # A span's start moves by the blocks at or before it, its end also by a block inside it.
    out.spans = [(s + shift(s, 1), e + shift(e, 0), k, i) for s, e, k, i in tr.spans]
    return out, student_pos


def episode_transcript(rollouts, i):
    """Episode i of a Rollouts batch as a Transcript (unpadded lists)."""
    n = int(rollouts.attention_mask[i].sum())
    tr = Transcript(rollouts.input_ids[i, :int(rollouts.prompt_len[i])].tolist())
    tr.ids = rollouts.input_ids[i, :n].tolist()
    tr.gen = rollouts.gen_mask[i, :n].tolist()
    tr.info = rollouts.info_mask[i, :n].tolist()
    tr.kind = rollouts.action_kind[i, :n].tolist()
    tr.spans = rollouts.spans[i]
    return tr


def teacher_batch(tokenizer, world, rollouts, rows, settings):
    """The teacher's inputs: one privileged sequence per episode in ``rows``, right-padded.

    Returns a dict of [len(rows), T'] tensors: input_ids, attention_mask, score_mask (1 on the
    teacher positions of the student's action tokens of the privileged kinds) and student_pos
    (the student position of each teacher token, -1 where inserted or padding). Each sequence
    is cut after its last scored token: nothing after it can change a score.
    """
    kinds = [KIND_IDS["search"]] * settings.evidence + [KIND_IDS["answer"]] * settings.answer
    seqs, blocks = [], {}    # a group's episodes share one question: encode its blocks once
    for i in rows:
        q = rollouts.questions[i]
        if q.qid not in blocks:
            blocks[q.qid] = privileged_ids(tokenizer, q, world)
        student = episode_transcript(rollouts, i)
        tr, pos = insert_privileged(student, *blocks[q.qid], settings, tokenizer)
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
def teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows, settings):
    """The teacher's log-probs of the student's action tokens in the episodes ``rows``, aligned
    to student positions: [N, T]. Every other position keeps the student's log-prob (a zero gap).

    One batched no-grad forward of the policy over the privileged sequences; the output
    projection runs only at the scored positions. Identical episodes of one question, frequent
    once a group agrees on its text, share one teacher sequence.
    """
    out = student_logp.detach().float().clone()                       # [N, T]
    copies = {}                                   # (question, token ids) -> episode indices
    for i in rows:
        n = int(rollouts.attention_mask[i].sum())
        key = (rollouts.questions[i].qid, tuple(rollouts.input_ids[i, :n].tolist()))
        copies.setdefault(key, []).append(i)
    if not copies:
        return out
    groups = list(copies.values())
    device = out.device
    batch = {k: v.to(device) for k, v in
             teacher_batch(tokenizer, world, rollouts, [g[0] for g in groups], settings).items()}
    lp = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["score_mask"],
                        temperature=settings.temperature)             # [U, T']
    scored = out[[g[0] for g in groups]]                              # [U, T]
    u, cols = batch["score_mask"].nonzero(as_tuple=True)
    scored[u, batch["student_pos"][u, cols]] = lp[u, cols]
    for g, row in zip(groups, scored):
        out[g] = row
    return out


# ----------------------------------------------------------------------------- the correction
def content_range(tokenizer, span_ids, kind):
    """(first, end) token offsets of an action span's content, between its opening tag and its
    closing tag: the query of a search, the answer of an answer. A token holding part of a tag
    counts as the tag's (model.tag_length); a span cut before its closing tag runs to its end."""
    first = tag_length(tokenizer, span_ids, kind)
    closing = SEARCH_END if kind == "search" else ANSWER_END
    text = tokenizer.decode(span_ids)
    at = text.find(closing, text.index(SEARCH if kind == "search" else ANSWER))
    end = token_at(tokenizer, span_ids, at) if at >= 0 else len(span_ids)
    return first, max(first, end)


def correction_mask(rollouts, tokenizer, settings):
    """m [N, T] bool: the generated tokens whose advantage the gap may correct. The action spans
    of the privileged kinds, opening tag to closing tag, with span="action"; with span="content"
    (the paper's), only the tokens between the tags (``content_range``)."""
    kind = rollouts.action_kind
    mask = torch.zeros_like(rollouts.gen_mask, dtype=torch.bool)
    if settings.evidence:
        mask |= kind == KIND_IDS["search"]
    if settings.answer:
        mask |= kind == KIND_IDS["answer"]
    mask &= rollouts.gen_mask.bool()
    if settings.span == "content":
        content = torch.zeros_like(mask)
        for i, spans in enumerate(rollouts.spans):
            for start, end, name, _ in spans:
                if name in KIND_IDS:
                    first, last = content_range(tokenizer,
                                                rollouts.input_ids[i, start:end].tolist(), name)
                    content[i, start + first:start + last] = True
        mask &= content
    return mask


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
