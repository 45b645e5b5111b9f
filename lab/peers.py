"""EviSD's peers: the same teacher's gap turned into credit in each paper's form.

train.py's METHOD picks one ("rlsd", "opsd", "sdar", "sd_search", "bicaa"); its step 4 calls
``credit``, which returns token advantages, the teacher's log-probs and, for the rules that add
a loss, that loss as a function of the policy. To compare *forms* of credit, every rule reads
the same teacher (evisd.py: each action kind re-scored under its own privileged context, as
EviSD's constants set it) and acts on the same tokens m (evisd.correction_mask: the content of
generated actions) unless its docstring says otherwise. Each formula is a pure function of
tensors; its docstring gives its source, its defaults and how sure we are of them, from
../shared/CREDIT-RULES.md (code = read in the authors' code; summary = read in a detailed public
summary of the paper), and ends with an "ours:" line: every way it departs from its paper.

Notation: A [N] the GRPO group advantage; gap = stopgrad(logp_teacher - logp_student) [N, T];
gen_mask [N, T] the generated tokens; mask [N, T] the tokens m a rule acts on.
"""
import torch

import evisd
import model
import rollout
import search_env
import train

# RLSD: w = clip(exp(sign(A) gap), 1 - eps, 1 + eps); mixed as (1 - mix) + mix * w
RLSD_EPS = 0.2
RLSD_MIX = 1.0               # the README's form; the authors' code starts at 0.5 and decays it
# OPSD: the gap added to the token advantage, unbounded
OPSD_COEF = 1.0
# SDAR: GRPO loss + lambda * token_mean(sigmoid(beta gap) * (logp_teacher - logp_student))
SDAR_LAMBDA = 0.01
SDAR_BETA = 5.0
# SD-Search: GRPO loss + alpha * mean JSD(teacher || student) over the top-k, on query tokens
SD_SEARCH_ALPHA = 1e-3
SD_SEARCH_TOP_K = 50
SD_SEARCH_START = 0          # alpha is 0 before this step: 50 in the paper's long runs; ours are
                             # 60 steps, so from the start (ours)
# BiCAA: turn advantage = A + alpha * sum_l gamma^l r~_{k+l}, criticality clipped to this range
BICAA_ALPHA = 0.25
BICAA_GAMMA = 1.0            # not given in the summary: ours
BICAA_CLIP = (0.5, 2.0)      # not given in the summary: ours


# ----------------------------------------------------------------------------- the formulas
@torch.no_grad()
def rlsd_advantages(adv, gap, gen_mask, mask, eps=RLSD_EPS, mix=RLSD_MIX):
    """RLSD (arXiv 2604.03128; code): Â = A * ((1 - mix) + mix * w) on m, with
    w = clip(exp(sign(A) * gap), 1 - eps, 1 + eps); the plain A on other generated tokens.
    The README's rule is mix = 1 (what this project shipped as EviSD in benchmarks v1-v3); the
    authors' code mixes with mix = 0.5 decayed to 0. Multiplicative: nothing where A = 0, and
    the sign of A survives (w > 0).
    ours: m, the content tokens (theirs: every response token); the teacher is the live policy
    reading EviSD's blocks (theirs: the ground-truth answer as a hint, frozen and re-synced
    every 20 steps); mix = 1 throughout (theirs: 0.5 decayed to 0)."""
    A = adv.detach().float()[:, None].expand_as(gap)                  # [N, T]
    w = torch.exp(torch.sign(A) * gap.detach().float()).clamp(1.0 - eps, 1.0 + eps)
    w = torch.where(mask.bool(), (1.0 - mix) + mix * w, torch.ones_like(w))
    return torch.where(gen_mask.bool(), A * w, torch.zeros_like(A))   # [N, T]


@torch.no_grad()
def opsd_advantages(adv, gap, gen_mask, mask, coef=OPSD_COEF):
    """OPSD (arXiv 2601.18734; code), its sampled-token variant beside the outcome advantage:
    Â = A + coef * gap on m. OPSD itself has no reward: its advantage is the gap alone, whose
    policy gradient is the sampled-token reverse KL to the teacher; adding it to A is the
    issue's reading and ours. Unbounded: it acts where A = 0 and can flip A's sign.
    ours: the sampled-token gap added to A on m (theirs by default: a full-vocabulary JSD on
    every generated token, no reward); the teacher is the live policy reading EviSD's blocks
    (theirs: the initial policy, fixed, with the solution in context)."""
    A = adv.detach().float()[:, None].expand_as(gap)                  # [N, T]
    out = A + coef * mask.float() * gap.detach().float()
    return torch.where(gen_mask.bool(), out, torch.zeros_like(A))     # [N, T]


def sdar_loss(logp, teacher_logp, gen_mask, mask, lam=SDAR_LAMBDA, beta=SDAR_BETA):
    """SDAR (arXiv 2605.15155; code): the term added to the GRPO loss,
        lam * token_mean( sigmoid(beta * gap) * (logp_teacher - logp) ),  gap detached,
    a gated push up on the sampled tokens the teacher prefers; the gradient flows through the
    student's ``logp`` [N, T] only. It acts where A = 0. The mean is over every generated token,
    as the paper's, but the sum runs over m only: our teacher scores m alone, and elsewhere its
    log-prob is the student's own, which would make the term a plain likelihood push. The
    formula is EviSD's gated-loss row (evisd.gated_distillation_loss), on m instead of the
    whole response.
    ours: the sum over m (theirs: every generated token); the teacher reads EviSD's blocks, the
    evidence or the golden answer (theirs: skill text)."""
    return evisd.gated_distillation_loss(logp, teacher_logp, gen_mask, mask, lam, beta)


def sd_search_loss(teacher_logits, student_logits, temperature, alpha=SD_SEARCH_ALPHA):
    """SD-Search (arXiv 2605.18299; summary): the term added to the GRPO loss, alpha times the
    mean top-k JSD between the teacher's and the student's next-token distributions at the
    query tokens (logits [M, V] each, at the sampling temperature).
    ours: the mean runs over every query token of the batch at once (the summary does not say
    per trajectory or per token); the teacher reads the gold evidence (theirs: a hindsight block
    of the group's queries, each labelled correct or not); alpha from step 0 (theirs: after
    step 50)."""
    jsd = top_k_jsd(teacher_logits / temperature, student_logits / temperature)   # [M]
    return alpha * jsd.mean()


def top_k_jsd(teacher_logits, student_logits, k=SD_SEARCH_TOP_K):
    """Symmetric Jensen-Shannon divergence per position [M] between the teacher's and the
    student's next-token distributions, both renormalised over the teacher's top k tokens
    (logits [M, V]). SD-Search (arXiv 2605.18299; summary) says "top-50"; renormalising over
    that set is our reading."""
    top = teacher_logits.topk(min(k, teacher_logits.shape[-1]), dim=-1).indices   # [M, k]
    p = teacher_logits.detach().gather(-1, top).log_softmax(-1)                     # [M, k]
    q = student_logits.gather(-1, top).log_softmax(-1)
    m = torch.logsumexp(torch.stack([p, q]), dim=0) - torch.log(torch.tensor(2.0))
    kl_pm = (p.exp() * (p - m)).sum(-1)
    kl_qm = (q.exp() * (q - m)).sum(-1)
    return 0.5 * (kl_pm + kl_qm)                                                    # [M]


@torch.no_grad()
def bicaa_turn_rewards(gains, criticality):
    """BiCAA (arXiv 2608.01321; summary): a turn's process reward from its gain g_k and its
    criticality w_k: w * g if g >= 0, else g / w (a critical turn's gain counts more, its loss
    less). [N, K] each, nan where an episode has no turn k."""
    return torch.where(gains >= 0, criticality * gains, gains / criticality)


@torch.no_grad()
def bicaa_advantages(adv, turn_rewards, turn_of_token, gen_mask, mask, group_size,
                     alpha=BICAA_ALPHA, gamma=BICAA_GAMMA):
    """BiCAA's token advantages: Â = A + alpha * sum_{l >= 0} gamma^l * r~_{k+l} on the m tokens
    of turn k, the plain A on other generated tokens. r~ is the turn rewards [N, K] (nan: no
    such turn) z-normalised within each group over all its turns; A is already the outcome's
    group z-score. turn_of_token [N, T]: each token's turn, -1 outside turns. The summary gives
    alpha = 0.25 and neither gamma nor the horizon: ours are gamma = 1 and every later turn.
    ours: the process term on m, the content tokens (theirs: every decision token); the outcome
    is EM (theirs: F1); one z-score pools all turns of a group (theirs: not given); gamma 1,
    every later turn, criticality clipped to BICAA_CLIP (theirs: not given)."""
    N, K = turn_rewards.shape
    r = turn_rewards.float().view(-1, group_size, K)                  # [questions, G, K]
    valid = ~torch.isnan(r)
    n = valid.sum((1, 2), keepdim=True).clamp(min=1)
    mean = torch.where(valid, r, 0.0).sum((1, 2), keepdim=True) / n
    var = torch.where(valid, (r - mean) ** 2, 0.0).sum((1, 2), keepdim=True) / (n - 1).clamp(min=1)
    z = torch.where(valid, (r - mean) / (var.sqrt() + 1e-4), 0.0).view(N, K)
    to_go = torch.zeros_like(z)                                       # [N, K] discounted sums
    running = torch.zeros(N, device=z.device)
    for k in reversed(range(K)):
        running = z[:, k] + gamma * running
        to_go[:, k] = running
    A = adv.detach().float()[:, None].expand_as(gen_mask).float()     # [N, T]
    turn = turn_of_token.clamp(min=0)
    process = torch.where(turn_of_token >= 0, to_go.gather(1, turn), 0.0)
    out = A + alpha * mask.float() * process
    return torch.where(gen_mask.bool(), out, torch.zeros_like(A))     # [N, T]


# ----------------------------------------------------------------------------- one step's credit
def rule(step):
    """The peer's credit at RL step ``step``, with evisd.credit's signature: what train.rl_step
    calls for METHOD in train.PEERS."""
    return lambda policy, tokenizer, world, rollouts, adv, student_logp, cfg: credit(
        cfg, step, policy, tokenizer, world, rollouts, adv, student_logp)


def credit(cfg, step, policy, tokenizer, world, rollouts, adv, student_logp):
    """Step 4 of train.rl_step for a peer's rule (METHOD): (token_adv [N, T], teacher_logp
    [N, T], extra_loss) where extra_loss(policy, logp) is the rule's term beside the clipped
    surrogate (SDAR, SD-Search) or None."""
    method = cfg["METHOD"]
    settings = cfg   # the teacher's context: EviSD's constants (evisd.py)
    device = adv.device
    gen_mask = rollouts.gen_mask.to(device)
    mask = evisd.correction_mask(rollouts, settings).to(device)
    # RLSD cannot act where A = 0: like EviSD it re-scores only the other episodes.
    rows = (adv.nonzero().squeeze(1).tolist() if method == "rlsd"
            else list(range(len(adv))))
    teacher_logp = evisd.teacher_logprobs(policy, tokenizer, world, rollouts, student_logp, rows,
                                          settings)
    gap = teacher_logp - student_logp
    token_adv = adv[:, None] * gen_mask
    extra_loss = None
    if method == "rlsd":
        token_adv = rlsd_advantages(adv, gap, gen_mask, mask)
    elif method == "opsd":
        token_adv = opsd_advantages(adv, gap, gen_mask, mask)
    elif method == "sdar":
        def extra_loss(policy, logp):
            return sdar_loss(logp, teacher_logp, gen_mask, mask)
    elif method == "sd_search":
        queries = mask & (rollouts.action_kind.to(device) == rollout.KIND_IDS["search"])
        teacher_logits = query_logits_teacher(policy, tokenizer, world, rollouts, queries,
                                              settings)

        def extra_loss(policy, logp):
            if teacher_logits is None or step < SD_SEARCH_START:
                return logp.new_zeros(())
            student = next_token_logits(policy, rollouts.input_ids.to(device),
                                        rollouts.attention_mask.to(device), queries)
            return sd_search_loss(teacher_logits, student, cfg["TEMPERATURE"])
    elif method == "bicaa":
        gains, turn_of_token = answer_gains(policy, tokenizer, rollouts, cfg["TEMPERATURE"])
        criticality = turn_criticality(teacher_logp, mask, turn_of_token, gains.shape[1])
        token_adv = bicaa_advantages(adv, bicaa_turn_rewards(gains, criticality).to(device),
                                     turn_of_token.to(device), gen_mask, mask, cfg["GROUP_SIZE"])
    else:
        raise ValueError(f"METHOD={method!r} is not a peer's rule: {train.PEERS}")
    return token_adv, teacher_logp, extra_loss


# ----------------------------------------------------------------------------- what the rules read
def next_token_logits(policy, input_ids, attention_mask, positions):
    """The policy's next-token logits [M, V] for the tokens at ``positions`` [N, T] (bool), in
    row-major order: position t's distribution comes from the hidden state at t - 1."""
    hidden = policy.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state           # [N, T, d]
    select = positions[:, 1:].bool()
    return policy.get_output_embeddings()(hidden[:, :-1][select]).float()     # [M, V]


@torch.no_grad()
def query_logits_teacher(policy, tokenizer, world, rollouts, queries, settings):
    """The teacher's next-token logits at the student's query tokens ``queries`` [N, T], in the
    student's row-major order; None if there are none. SD-Search's teacher reads a hindsight
    block of the group's queries labelled correct or not; ours reads the gold evidence, so the
    rules differ in form only."""
    rows = [i for i in range(len(queries)) if queries[i].any()]
    if not rows:
        return None
    batch = evisd.teacher_batch(tokenizer, world, rollouts, rows, settings)
    pos = batch["student_pos"]
    wanted = torch.zeros_like(batch["score_mask"], dtype=torch.bool)
    for u, i in enumerate(batch["owner"].tolist()):
        inside = pos[u] >= 0      # a query token, where this sequence scores it (its evidence's)
        wanted[u, inside] = queries[i].cpu()[pos[u, inside]] & batch["score_mask"][u, inside].bool()
    device = queries.device
    return next_token_logits(policy, batch["input_ids"].to(device),
                             batch["attention_mask"].to(device), wanted.to(device))


def turn_runs(gen_row):
    """[(start, end)] of the runs of generated tokens in one episode: its turns, in order (every
    turn but the last is followed by its observation)."""
    runs, start = [], None
    for t, g in enumerate(gen_row + [0]):
        if g and start is None:
            start = t
        elif not g and start is not None:
            runs.append((start, t))
            start = None
    return runs


@torch.no_grad()
def answer_gains(policy, tokenizer, rollouts, temperature):
    """BiCAA's gains: g_k = L_k - L_{k-1}, with L_k the token-mean log-prob of the golden answer's
    tokens, written as an <answer> action after the episode's first k turns and their
    observations (L_0: after the prompt). Returns (gains [N, K] with nan where an episode has
    no turn k, turn_of_token [N, T] long: each generated token's turn, -1 elsewhere)."""
    N, T = rollouts.input_ids.shape
    turns = [turn_runs(rollouts.gen_mask[i].tolist()) for i in range(N)]
    K = max(len(t) for t in turns)
    turn_of_token = torch.full((N, T), -1, dtype=torch.long)
    seqs, scored, owners = [], [], []
    for i, runs in enumerate(turns):
        n = int(rollouts.attention_mask[i].sum())
        # the answer action's tokens; only the answer's own (between the tags) are scored
        opening, answer, closing = (tokenizer.encode(text, add_special_tokens=False) for text in
                                    (search_env.ANSWER, f" {rollouts.questions[i].answers[0]} ",
                                     search_env.ANSWER_END))
        ends = [s for s, _ in runs[1:]] + [n]     # prefix after turn k ends where turn k+1 starts
        for k, (s, e) in enumerate(runs):
            turn_of_token[i, s:e] = k
        prefix_ends = [int(rollouts.prompt_len[i])] + ends
        for k, end in enumerate(prefix_ends):
            ids = rollouts.input_ids[i, :end].tolist()
            seqs.append(ids + opening + answer + closing)
            scored.append([0] * (len(ids) + len(opening)) + [1] * len(answer) + [0] * len(closing))
            owners.append((i, k))
    device = next(policy.parameters()).device
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in seqs])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    score = torch.tensor([s + [0] * (width - len(s)) for s in scored])
    L = torch.full((N, K + 1), float("nan"))
    for c in range(0, len(seqs), 64):
        lp = model.token_logprobs(policy, ids[c:c + 64].to(device),
                                  attention[c:c + 64].to(device), score[c:c + 64].to(device),
                                  temperature=temperature).cpu()
        means = (lp.sum(1) / score[c:c + 64].sum(1)).tolist()
        for (i, k), value in zip(owners[c:c + 64], means):
            L[i, k] = value
    return L[:, 1:] - L[:, :-1], turn_of_token


@torch.no_grad()
def turn_criticality(teacher_logp, mask, turn_of_token, K):
    """BiCAA's criticality w_k [N, K]: the geometric-mean probability of turn k's action tokens
    under the privileged teacher (the summary: with the golden answer in the prompt; ours: the
    same teacher as every rule here), over its episode's mean, clipped to BICAA_CLIP. A turn
    with no such token gets 1."""
    N = teacher_logp.shape[0]
    out = torch.ones(N, K)
    lp, m, turn = teacher_logp.float().cpu(), mask.cpu(), turn_of_token.cpu()
    for i in range(N):
        values = {}
        for k in range(K):
            sel = m[i] & (turn[i] == k)
            if sel.any():
                values[k] = lp[i][sel].mean().exp().item()
        if values:
            mean = sum(values.values()) / len(values)
            for k, v in values.items():
                out[i, k] = min(max(v / mean, BICAA_CLIP[0]), BICAA_CLIP[1]) if mean > 0 else 1.0
    return out
