"""EviSD: evidence-conditioned self-distillation as a bounded correction of GRPO advantages.

The *same* model, with no gradient, re-scores the student's own tokens as a privileged teacher:
a search action's teacher reads the question's gold evidence (formatted like retrieved text),
an answer action's teacher the golden answer, neither the other's. The detached gap corrects
the GRPO advantage of the content of those actions (m_t = 1 on the query, the answer):

    delta_t = stopgrad(log p_teacher(y_t) - log p_student(y_t))
    Â_t     = A + lambda * |A| * m_t * tanh(tau * delta_t)        lambda = 0.2, tau = 5

as a detailed public summary of arXiv 2608.01359 gives it: at most lambda * |A|, never a sign flip,
nothing where A = 0. The knobs are train.py's EviSD constants, by name. Reading order: the formulas,
``credit`` (train.rl_step's call), the tokens it corrects, then the teacher's context."""
import torch

from model import token_logprobs
from rollout import pad
from search_env import INFO, INFO_END, format_information

# train.py's constants read here, each with when another leaves it without effect ({OTHER:
# value}, named before a run; METHOD="grpo" leaves them all). --resume refuses to change any.
KNOBS = {"EVISD_LAMBDA": {"EVISD_FORM": "gated_loss"}, "EVISD_GATE_COEF": {"EVISD_FORM": "bounded"},
         "EVISD_TAU": {}, "EVISD_SPAN": {}, "EVISD_FORM": {}, "USE_SEARCH_EVIDENCE": {},
         "USE_ANSWER_PRIVILEGE": {}, "EVIDENCE_AT": {"USE_SEARCH_EVIDENCE": False},
         "TEACHER_CONTEXT": {"USE_SEARCH_EVIDENCE": False, "USE_ANSWER_PRIVILEGE": False},
         "ANSWER_AT": {"EVISD_SPAN": "response", "USE_ANSWER_PRIVILEGE": False}}
CHOICES = {"EVISD_SPAN": ("content", "action", "response"), "EVISD_FORM": ("bounded", "gated_loss"),
           "TEACHER_CONTEXT": ("aligned", "shared"), "EVIDENCE_AT": ("every", "first"),
           "ANSWER_AT": ("content", "tag")}


def check_config(cfg):
    """Stop, before any work, on an EviSD setting that is not allowed or would go unread."""
    for name, allowed in CHOICES.items():
        if cfg[name] not in allowed:
            raise SystemExit(f"{name}={cfg[name]!r}: allowed values are {', '.join(allowed)}")
    # The paper's gated-loss row is response-wide; a narrower span would be another experiment.
    if cfg["EVISD_FORM"] == "gated_loss" and cfg["EVISD_SPAN"] != "response":
        raise SystemExit(f"EVISD_FORM='gated_loss' is the paper's response-wide row: set "
                         f"EVISD_SPAN='response' too (got {cfg['EVISD_SPAN']!r})")


# ----------------------------------------------------------------------------- the formulas
@torch.no_grad()
def evisd_correction(adv, gap, gen_mask, mask, lam, tau):
    """Â [N, T] = A + lam * |A| * m * tanh(tau * gap) on generated tokens, 0 elsewhere: the sign
    of A survives (lam < 1), A = 0 gives Â = 0, a large gap saturates. adv [N], the rest [N, T]."""
    A = adv.detach().float()[:, None].expand_as(gap)                  # [N, T]
    correction = lam * A.abs() * mask.float() * torch.tanh(tau * gap.detach().float())
    return torch.where(gen_mask.bool(), A + correction, torch.zeros_like(A))   # [N, T]


def gated_distillation_loss(logp, teacher_logp, gen_mask, mask, coef, tau):
    """The gated-loss row in our reading (the summary only names it): SDAR's term (arXiv
    2605.15155) beside plain GRPO advantages, EviSD's tau as the gate, acting where A = 0 too:
        coef * sum_t m_t * sigmoid(tau * gap_t) * (logp_teacher_t - logp_t) / (generated tokens)
    The gate is detached: the gradient flows through the student's ``logp`` [N, T] only."""
    gap = (teacher_logp - logp).detach()                              # [N, T]
    per_token = torch.sigmoid(tau * gap) * (teacher_logp.detach() - logp)
    return coef * (per_token * mask.float()).sum() / gen_mask.float().sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- credit
def credit(policy, tokenizer, world, rollouts, adv, student_logp, cfg):
    """The teacher's re-scoring, then the correction: (token_adv [N, T], teacher_logp [N, T], the
    student's where unscored, extra_loss: None, or the gated loss's term ``extra_loss(policy,
    logp)``) from adv [N] and the student's detached log-probs student_logp [N, T]."""
    gen_mask = rollouts.gen_mask.to(adv.device)                       # [N, T]
    mask = correction_mask(rollouts, cfg).to(adv.device)              # m [N, T]
    bounded = cfg["EVISD_FORM"] == "bounded"
    # The bounded form gives Â = 0 where A = 0, whatever the teacher says: only the episodes
    # with A != 0 are re-scored. The gated loss acts everywhere.
    rows = adv.nonzero().squeeze(1).tolist() if bounded else list(range(len(adv)))
    teacher_logp = teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows, cfg)
    if bounded:
        token_adv = evisd_correction(adv, teacher_logp - student_logp, gen_mask, mask,
                                     cfg["EVISD_LAMBDA"], cfg["EVISD_TAU"])
        return token_adv, teacher_logp, None

    def extra_loss(policy, logp):
        return gated_distillation_loss(logp, teacher_logp, gen_mask, mask,
                                       cfg["EVISD_GATE_COEF"], cfg["EVISD_TAU"])
    return adv[:, None] * gen_mask, teacher_logp, extra_loss


# ----------------------------------------------------------------------------- which tokens
def scored_range(span, cfg):
    """The range [lo, hi) of one turn (rollout.Span) that EVISD_SPAN covers: its content (the
    paper's), its whole action with the tags (ours), or the whole turn; never a token before the
    turn's privileged block (the <answer> tag under ANSWER_AT="content"), which no teacher read."""
    lo, hi = {"content": (span.content_start, span.content_end), "action": (span.action, span.end),
              "response": (span.start, span.end)}[cfg["EVISD_SPAN"]]
    return max(lo, block_position(span, cfg)), hi


def scored_turns(spans, cfg):
    """(searching turns, answer turns) of one episode that a teacher scores, none of a kind
    without privilege; under the "response" span, invalid turns are still searching."""
    searching = ("search", "invalid") if cfg["EVISD_SPAN"] == "response" else ("search",)
    return ([s for s in spans if s.kind in searching and cfg["USE_SEARCH_EVIDENCE"]],
            [s for s in spans if s.kind == "answer" and cfg["USE_ANSWER_PRIVILEGE"]])


def correction_mask(rollouts, cfg):
    """m [N, T] bool: the generated tokens whose credit the gap may change."""
    mask = torch.zeros_like(rollouts.gen_mask, dtype=torch.bool)
    for i, spans in enumerate(rollouts.spans):
        for span in sum(scored_turns(spans, cfg), []):   # the searches, then the answers
            mask[i, slice(*scored_range(span, cfg))] = True
    return mask & rollouts.gen_mask.bool()


# ----------------------------------------------------------------------------- teacher context
def privileged_ids(tokenizer, question, world):
    """Token ids of a question's two privileged blocks, (gold evidence, golden answer), each
    formatted like retrieved information; no evidence block for a question without one."""
    docs = world.evidence_docs(question)
    answer = f"{INFO} the answer is {question.answers[0]}. {INFO_END}"
    return (tokenizer.encode(format_information(docs), add_special_tokens=False) if docs else [],
            tokenizer.encode(answer, add_special_tokens=False))


def teachers(spans, evidence_ids, answer_ids, cfg):
    """The teachers of one episode, [(block ids, turns they score)]. Aligned (the paper's): the
    searches read the evidence, the answer the golden answer. Shared: one block holding both."""
    searches, answers = scored_turns(spans, cfg)
    searches = searches if evidence_ids else []
    if cfg["TEACHER_CONTEXT"] == "shared":
        block = ((evidence_ids if cfg["USE_SEARCH_EVIDENCE"] else [])
                 + (answer_ids if cfg["USE_ANSWER_PRIVILEGE"] else []))
        return [(block, sorted(searches + answers))]
    return [(evidence_ids, searches), (answer_ids, answers)]


def block_position(span, cfg):
    """Where a turn's block goes: before the first token scored in it. For the answer, right
    after its opening tag (ANSWER_AT="content", ours): the golden answer then informs what is
    answered, not the decision to answer, which it would approve however early."""
    if cfg["EVISD_SPAN"] == "response":
        return span.start
    if span.kind == "answer" and cfg["ANSWER_AT"] == "content":
        return span.content_start
    return span.action


def insert_blocks(ids, inserts):
    """(ids with ``inserts[p]`` placed before position p, student_pos): each token's position
    in the student's ``ids``, -1 for an inserted one."""
    out, student_pos, prev = [], [], 0
    for cut in sorted(inserts) + [len(ids)]:
        block = inserts.get(cut, [])
        out += ids[prev:cut] + block
        student_pos += [*range(prev, cut), *[-1] * len(block)]
        prev = cut
    return out, student_pos


def teacher_batch(tokenizer, world, rollouts, rows, cfg):
    """The teachers' inputs for the episodes ``rows``, right-padded [S, T'] tensors: input_ids,
    attention_mask, score_mask, student_pos (-1 where inserted or padding); owner [S]. A teacher
    reads its block before each of its turns (EVIDENCE_AT="first", ours: before the first only)
    and is cut after the last token it scores (nothing later can change a score)."""
    seqs, owner = [], []                            # each teacher's (ids, score, student_pos)
    for i in rows:
        blocks = privileged_ids(tokenizer, rollouts.questions[i], world)
        student = rollouts.input_ids[i, :int(rollouts.attention_mask[i].sum())].tolist()
        for block, turns in teachers(rollouts.spans[i], *blocks, cfg):
            scored = {p for s in turns for p in range(*scored_range(s, cfg))}
            if not scored:
                continue
            positions = [block_position(s, cfg) for s in turns]
            positions = positions if cfg["EVIDENCE_AT"] == "every" else positions[:1]
            ids, student_pos = insert_blocks(student, {at: block for at in positions})
            score = [int(p in scored) for p in student_pos]
            last = max(j for j, s in enumerate(score) if s) + 1
            seqs.append((ids[:last], score[:last], student_pos[:last]))
            owner.append(i)
    return dict(input_ids=pad([s[0] for s in seqs], tokenizer.pad_token_id),
                attention_mask=pad([[1] * len(s[0]) for s in seqs], 0),
                score_mask=pad([s[1] for s in seqs], 0),
                student_pos=pad([s[2] for s in seqs], -1),
                owner=torch.tensor(owner, dtype=torch.long))


@torch.no_grad()
def teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows, cfg):
    """[N, T]: the teacher's log-probs of the scored tokens of the episodes ``rows`` at their
    student positions, the student's elsewhere (a zero gap). One no-grad forward at the sampling
    TEMPERATURE; identical episodes of one question share their teacher sequences."""
    out = student_logp.detach().float().clone()                       # [N, T]
    copies = {}                                   # (question, token ids) -> episode indices
    for i in rows:
        n = int(rollouts.attention_mask[i].sum())
        key = (rollouts.questions[i].qid, tuple(rollouts.input_ids[i, :n].tolist()))
        copies.setdefault(key, []).append(i)
    batch = teacher_batch(tokenizer, world, rollouts, [g[0] for g in copies.values()], cfg)
    if not len(batch["owner"]):
        return out
    batch = {k: v.to(out.device) for k, v in batch.items()}
    lp = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["score_mask"],
                        temperature=cfg["TEMPERATURE"])               # [S, T']
    s, cols = batch["score_mask"].nonzero(as_tuple=True)
    # each scored token, back to its episode and its student position
    out[batch["owner"][s], batch["student_pos"][s, cols]] = lp[s, cols]
    for group in copies.values():
        out[group[1:]] = out[group[0]].clone()
    return out
