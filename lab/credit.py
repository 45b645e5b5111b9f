"""The credit-assignment lab: does the teacher's gap point the right way?

EviSD rescales the advantage of each action token by w = clip(exp(sign(A)·g), 1−ε, 1+ε), with
g = log p_teacher − log p_student. Whatever the sign of A, that moves credit the right way
exactly when g > 0 on good actions and g < 0 on bad ones: a good search in a failed episode is
penalised less, a premature answer in a lucky one rewarded less. A synthetic world knows
which actions were good (``toy_world.label_actions``), so the teacher can be graded:

* ``action_records`` cuts every action of the scored episodes into its *decision tag* (the
  opening ``<search>``/``<answer>``: search now or answer now?) and its *content* (the query
  or the answer, with the closing tag), each with its oracle label, its mean gap and mean w;
* ``auc`` is the probability that a good action's gap exceeds a bad one's (0.5: the teacher
  knows nothing; 1.0: it separates them perfectly);
* ``misassigned_mass`` is the share of Σ|Â| over action tokens whose sign disagrees with the
  label, for GRPO (Â = A) and for EviSD (Â = A·w) on the same batch;
* ``report`` samples groups on held-out questions as training does and puts it all together;
  ``python evaluate.py RUN --credit`` prints it, and with ``--variants`` it grades every
  design choice of ``VARIANTS`` (where the teacher's blocks go, ε, ...) on the same samples.

``show_episodes`` prints sampled episodes with each action token's gap (``--show``); ``main``
is what ``python evaluate.py RUN --credit`` and ``--show`` run.
"""
import html
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
import runs
import search_env
import toy_world
import train

PARTS = ("tag", "content")


def mean(values):
    return sum(values) / len(values)


# ----------------------------------------------------------------------------- labels
def episode_labels(rollouts, world, top_k):
    """The oracle labels of every episode of a Rollouts batch: a list (None where unknown)."""
    if rollouts.turn_texts is None:        # a batch built from transcripts, not played
        return [None] * len(rollouts.questions)
    return [world.oracle_labels(q, turns, top_k)
            for q, turns in zip(rollouts.questions, rollouts.turn_texts)]


# ----------------------------------------------------------------------------- the report card
def action_records(rollouts, labels, adv, gap, weight, tokenizer, rows):
    """One record per (action, part) of the episodes in ``rows``.

    adv [N]; gap, weight [N, T] (g and w per token). The decision tag is the span's tokens up to
    the one that completes the opening tag, found in the decoded span as model.rollout finds
    spans (one token for the embedded tokenizer, several for a pretrained one); the content is
    the rest of the span. A tag is good when its decision was right, content when its label is
    in ``GOOD_LABELS``; a part whose label is None (real data) gets no record.
    """
    records = []
    for i in rows:
        if labels[i] is None:
            continue
        for start, end, kind, turn in rollouts.spans[i]:
            if kind not in model.KIND_IDS:
                continue
            lab = labels[i][turn]
            cut = start + model.tag_length(tokenizer, rollouts.input_ids[i, start:end].tolist(),
                                           kind)
            for part, (a, b), good, name in (
                    ("tag", (start, cut), lab.decision_ok, "right" if lab.decision_ok else "wrong"),
                    ("content", (cut, end),
                     None if lab.label is None else lab.label in toy_world.GOOD_LABELS, lab.label)):
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
    sign = {key: torch.zeros(shape)
            for key in ("all", *((k, p) for k in ("search", "answer") for p in PARTS))}
    for r in records:
        for key in ("all", (r["kind"], r["part"])):
            sign[key][r["episode"], r["start"]:r["end"]] = 1.0 if r["good"] else -1.0
    grpo_adv = adv[:, None].expand(shape)
    parts = {}
    for key, s in sign.items():
        rs = [r for r in records if key == "all" or (r["kind"], r["part"]) == key]
        name = key if key == "all" else f"{key[0]}_{key[1]}"
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
]
VARIANTS = {(", ".join(f"{k}={v}" for k, v in o.items()) or "as configured"): o
            for o in VARIANT_OVERRIDES}


def sample(lm, tokenizer, cfg, world, questions, group_size):
    """Episodes of ``questions`` sampled as a training step samples them (Rollouts), their group
    advantages A [N] and the student's log-probs [N, T]."""
    envs = search_env.episodes(world, questions, group_size, cfg["MAX_TURNS"], cfg["TOP_K"])
    r = model.rollout(lm, tokenizer, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    adv = grpo.group_advantages(r.rewards, group_size)                          # [N]
    with torch.no_grad():
        lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask,
                                    temperature=cfg["TEMPERATURE"])             # [N, T]
    return r, adv, lp_s


def report(lm, tokenizer, cfg, sets, seed=0, progress=None, variants=None):
    """The report card on held-out questions. ``sets``: [(world, questions)]; each world's
    questions are played in chunks of QUESTIONS_PER_STEP, GROUP_SIZE samples at TEMPERATURE,
    exactly like training batches. Returns a JSON-ready dict (see ``summarise``) with the
    label counts of the sampled actions; with ``variants`` ({name: config overrides}), one such
    dict per variant, all scored on the same sampled batches."""
    lm.eval()
    # The card grades EviSD's teacher, whichever method the run trained with.
    configs = {name: dict(cfg, METHOD="evisd", **overrides)
               for name, overrides in (variants or {"": {}}).items()}
    records = {name: [] for name in configs}
    token_advs = {name: [] for name in configs}
    labels_all, all_adv, n_episodes, width = [], [], 0, 0
    for world, questions in sets:
        for c in range(0, len(questions), cfg["QUESTIONS_PER_STEP"]):
            chunk = questions[c:c + cfg["QUESTIONS_PER_STEP"]]
            torch.manual_seed(seed * 1_000_003 + n_episodes)
            # What one training step computes: A, the student's log-probs, and per variant the
            # teacher's (on the episodes with A != 0) and Â.
            r, adv, lp_s = sample(lm, tokenizer, cfg, world, chunk, cfg["GROUP_SIZE"])
            labels = episode_labels(r, world, cfg["TOP_K"])
            rows = adv.nonzero().squeeze(1).tolist()
            for name, vcfg in configs.items():
                token_adv, lp_t = evisd.corrected_advantages(lm, tokenizer, world, r, adv, lp_s,
                                                             train.evisd_settings(vcfg))
                w = token_adv / torch.where(adv == 0, 1.0, adv)[:, None]   # Â / A: EviSD's factor
                for rec in action_records(r, labels, adv, lp_t - lp_s, w, tokenizer, rows):
                    rec["episode"] += n_episodes    # index into the concatenated batch below
                    records[name].append(rec)
                token_advs[name].append(token_adv)
            all_adv.append(adv)
            width = max(width, token_adv.shape[1])
            labels_all += labels
            n_episodes += len(adv)
            if progress:
                progress(len(chunk))
    adv = torch.cat(all_adv)
    cards = {}
    for name in configs:
        token_adv = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]))
                               for t in token_advs[name]])
        cards[name] = summarise(records[name], adv, token_adv)
        cards[name].update(episodes=n_episodes, scored_episodes=int((adv != 0).sum()),
                           shares=toy_world.label_shares(labels_all))
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


# ----------------------------------------------------------------------------- episodes by gap
def printable(text):
    """``text`` as stdout can encode it: a lone surrogate or a character the terminal lacks
    becomes a backslash escape, so no model output can crash a print."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def show_episodes(lm, tok, cfg, world, qs, html_path, k):
    """Sample 4 episodes of each question in ``qs``, score them exactly as a training step would,
    and print two episodes of ``k`` questions with every action token's teacher-student gap
    (evaluate.py --show; also as HTML): questions whose samples disagree first, since a group
    that agrees has A = 0, which training never asks the teacher about (its gap shows as 0)."""
    torch.manual_seed(0)
    r, adv, lp_s = sample(lm, tok, cfg, world, qs, 4)
    # The teacher's gap, whichever method the run trained with.
    token_adv, lp_t = evisd.corrected_advantages(lm, tok, world, r, adv, lp_s,
                                                 train.evisd_settings(cfg))
    # stable
    groups = sorted(range(0, len(qs) * 4, 4), key=lambda i: not adv[i:i + 4].any())[:k]
    tty = sys.stdout.isatty()
    pages = []
    for i in groups:
        for j in (i, i + 1):   # two samples of each question
            n = int(r.attention_mask[j].sum())
            p = int(r.prompt_len[j])
            head = (f"Q: {r.questions[j].question}  gold={r.questions[j].answers[0]}  "
                    f"reward={r.rewards[j]:.0f}  A={adv[j]:+.2f}")
            print("\n" + printable(head))
            text, page = [], [f"<p><b>{html.escape(head)}</b><br>"]
            for t in range(p, n):
                piece = tok.decode([int(r.input_ids[j, t])])
                if r.info_mask[j, t]:
                    text.append("\x1b[2m" + piece + "\x1b[0m" if tty else piece)
                    page.append(f"<span style='color:#999'>{html.escape(piece)}</span>")
                elif r.action_kind[j, t]:
                    g = (lp_t[j, t] - lp_s[j, t]).item()
                    colour = "32" if g > 0 else "31"
                    text.append(f"\x1b[{colour}m{piece}\x1b[0m[{g:+.1f}]" if tty
                                else f"{piece}[{g:+.1f}]")
                    alpha = min(abs(g) / 2, 1)
                    rgb = "0,160,0" if g > 0 else "200,0,0"
                    page.append(f"<span title='gap {g:+.2f}, "
                                f"Â/A {token_adv[j, t] / adv[j] if adv[j] else 1:.2f}' "
                                f"style='background:rgba({rgb},{alpha:.2f})'>"
                                f"{html.escape(piece)}</span>")
                else:
                    text.append(piece)
                    page.append(html.escape(piece))
            print(printable("".join(text)))
            pages.append("".join(page) + "</p>")
    with open(html_path, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write("<html><meta charset='utf-8'>"
                "<body style='font-family:monospace;white-space:pre-wrap'>"
                "<h3>Teacher-student gap per action token (green: teacher more likely; "
                "hover for values)</h3>"
                + "\n".join(pages) + "</body></html>")
    print(f"\nwrote {html_path}")


# --------------------------------------------------------------------- evaluate.py --credit, --show
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
    """``python evaluate.py RUN ... --credit [Q] [--variants] [--validation]`` or ``--show K``:
    the report card of each run (printed, and written as JSON), or K groups of episodes."""
    if args.show:
        lm, tok, cfg, _ = runs.load_run(args.runs[0])
        # the groups with A != 0 are shown first
        world, qs = question_sets(cfg, 4 * args.show)[0]
        show_episodes(lm, tok, cfg, world, qs, os.path.join(args.runs[0], "episodes.html"),
                      args.show)
        return
    cards = {}
    for run in args.runs:
        lm, tok, cfg, _ = runs.load_run(run)
        sets = question_sets(cfg, args.credit, args.validation)
        with tqdm(total=args.credit, desc=f"credit {run}", dynamic_ncols=True) as bar:
            cards[run] = report(lm, tok, cfg, sets, progress=bar.update,
                                variants=VARIANTS if args.variants else None)
        table = variants_table(cards[run]) if args.variants else format_report(cards[run])
        print(f"\n## {run}\n\n{table}")
    out = args.json or os.path.join(args.runs[0], "credit.json")
    with open(out, "w") as f:
        json.dump(cards, f, indent=1)
    print("wrote", out)
