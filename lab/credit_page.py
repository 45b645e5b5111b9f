"""One RL step's credit, token by token, as a page a learner opens in a browser.

    python lab/report.py out/fast --credit-page out/fast/credit.html
    python lab/report.py out/fast --credit-page out/fast/span.html --EVISD_SPAN=response
    python lab/report.py out/fast out/grpo-s0 --credit-page out/fast/two-runs.html

The page holds one batch as train.rl_step samples it (QUESTIONS_PER_STEP questions, GROUP_SIZE
episodes each, at TEMPERATURE), of a fixed group of validation questions under a fixed seed: two
runs, or one run before and after an edit, show the same questions. Each column is a run (or the
first run under other settings, given as train.py's ``--NAME=value``), and each column scores
the same sampled tokens (the first column's model drew them) with step 4 of rl_step: A, then Â.

- Each generated token is coloured by Â − A on one scale, centred at 0 and ending at ±λ|A|
  (blue: the teacher pushed the token up; red: down; white: untouched). Prompt and
  ``<information>`` tokens are grey: the environment wrote them, and no credit reaches them.
- Hovering over a token (or tapping it) shows the token, A, Â, δ and whether m covers it.
- Each privileged block sits where its teacher read it, framed, before the action it scores:
  the gold evidence before a search, the golden answer inside ``<answer>``. The blocks come
  from evisd.teacher_batch itself, so they are what the teacher read, not a description of it.

One file, no network, no framework: a style sheet and a few lines of script for the tooltip.
"""
import html
import os
import time
from collections import defaultdict

import torch

import evisd
import model
import runs
import train
from lab import credit as lab_credit
from lab import peers

# Â − A > 0: the teacher found the token likelier than the student did; < 0: less likely.
UP, DOWN = (33, 102, 172), (178, 24, 43)


# ----------------------------------------------------------------------------- what a column holds
def step_credit(lm, tok, cfg, world, r, adv):
    """Step 4 of train.rl_step on a sampled batch, with ``lm`` as student and teacher:
    token_adv Â [N, T], delta δ [N, T] (teacher − student, 0 where no teacher scored), mask m
    [N, T], and the teachers' blocks where they read them (``teacher_reads``)."""
    with torch.no_grad():
        student = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask,
                                       temperature=cfg["TEMPERATURE"])       # [N, T]
    token_adv, teacher = adv[:, None] * r.gen_mask, student                  # GRPO: Â = A
    mask, reads = torch.zeros_like(r.gen_mask, dtype=torch.bool), {}
    if cfg["METHOD"] != "grpo":
        rule = evisd.credit if cfg["METHOD"] == "evisd" else peers.rule(0)   # as rl_step
        token_adv, teacher, _ = rule(lm, tok, world, r, adv, student, cfg)
        mask = evisd.correction_mask(r, cfg)
        # evisd.credit's bounded form asks its teachers only where A != 0 (elsewhere Â = 0).
        bounded = cfg["METHOD"] == "evisd" and cfg["EVISD_FORM"] == "bounded"
        rows = adv.nonzero().squeeze(1).tolist() if bounded else list(range(len(adv)))
        reads = teacher_reads(tok, world, r, rows, cfg)
    return dict(token_adv=token_adv.float(), delta=(teacher - student).float(), mask=mask,
                reads=reads)


def teacher_reads(tok, world, r, rows, cfg):
    """{episode: {student position: [(which teacher, block text)]}}: every block inserted in a
    teacher's input by evisd.teacher_batch, placed before the student token it precedes."""
    batch = evisd.teacher_batch(tok, world, r, rows, cfg)
    reads = defaultdict(lambda: defaultdict(list))
    for s, i in enumerate(batch["owner"].tolist()):
        n = int(batch["attention_mask"][s].sum())
        ids, pos = batch["input_ids"][s, :n].tolist(), batch["student_pos"][s, :n].tolist()
        scored = {pos[j] for j in range(n) if batch["score_mask"][s, j]}
        kinds = sorted({span.kind for span in r.spans[i] for p in scored
                        if span.start <= p < span.end})
        who = f"the {' and '.join(kinds)} teacher reads"
        j = 0
        while j < n:
            if pos[j] != -1:
                j += 1
                continue
            k = j
            while pos[k] == -1:      # a teacher's input ends on a scored token, never a block
                k += 1
            reads[i][pos[k]].append((who, tok.decode(ids[j:k])))
            j = k
    return reads


def columns(run_dirs, overrides):
    """[(label, lm, tok, cfg)]: each run as it trained, then the first run under ``overrides``
    (train.py's --NAME=value, checked as train.py checks them) when there are any."""
    cols = []
    for run in run_dirs:
        lm, tok, cfg, _ = runs.load_run(run)
        cols.append((f"{run} ({cfg['METHOD']})", lm, tok, cfg))
    if overrides:
        _, lm, tok, cfg = cols[0]
        changed, resume, overwrite = runs.parse_overrides(overrides, cfg, train.SCHEMA)
        if resume or overwrite:
            raise SystemExit("--credit-page: settings after it are --NAME=value; --resume and "
                             "--overwrite are train.py's")
        cols.append((f"{run_dirs[0]}, {' '.join(overrides)}", lm, tok, changed))
    first = cols[0][2].get_vocab()
    for label, _, tok, _ in cols[1:]:
        if tok.get_vocab() != first:
            raise SystemExit(f"{label}: another tokenizer than {cols[0][0]}'s, so it cannot score "
                             "the same sampled tokens")
    return cols


def sample_step(lm, tok, cfg, seed=0):
    """(world, rollouts, A [N]): one step's batch of the fixed validation group, sampled as the
    report card samples (lab/credit.batches: a training batch under its own seed)."""
    sets = lab_credit.question_sets(cfg, cfg["QUESTIONS_PER_STEP"], validation=True)
    world, r, adv, _, _, _ = next(lab_credit.batches(lm, tok, cfg, sets[:1], seed))
    return world, r, adv


# ----------------------------------------------------------------------------- the page
def colour(shift, scale):
    """The background of a token whose advantage moved by ``shift`` on a scale ending at
    ±``scale``: white at 0, UP or DOWN at the scale's ends (and beyond)."""
    x = max(-1.0, min(1.0, shift / scale)) if scale else 0.0
    end = UP if x > 0 else DOWN
    return "#" + "".join(f"{round(255 + (c - 255) * abs(x)):02x}" for c in end)


def episode_html(tok, r, i, adv, col, lam):
    """One episode of one column: its header, its prompt (folded), and its transcript."""
    q, a = r.questions[i], float(adv[i])
    n, p = int(r.attention_mask[i].sum()), int(r.prompt_len[i])
    ids = r.input_ids[i].tolist()
    # the colour scale's end: λ|A|; where A = 0 (a peer may credit there), λ, as if |A| were 1
    scale = lam * (abs(a) or 1.0)
    head = (f"<h4>#{i} · {html.escape(q.question)} <span class=gold>gold: "
            f"{html.escape(q.answers[0])}</span> · reward {float(r.rewards[i]):.2f} · "
            f"A = {a:+.3f}"
            + (" <span class=g>(A = 0: Â = 0, whatever a teacher would say)</span>"
               if not a and not col["token_adv"][i].any() else "") + "</h4>")
    out = [f"<div class=ep id=e{i} data-a='{a:.9g}'>{head}<details><summary>prompt"
           f"</summary><span class=g>{html.escape(tok.decode(ids[:p]))}</span></details><p>"]
    reads, grey = col["reads"].get(i, {}), []
    for t in range(p, n):
        for who, text in reads.get(t, []):
            out.append(f"<span class=ctx><b>{who}</b>{html.escape(text)}</span>")
        piece = html.escape(tok.decode([ids[t]]))
        if not r.gen_mask[i, t]:
            grey.append(piece)
            if t + 1 == n or r.gen_mask[i, t + 1] or t + 1 in reads:
                out.append(f"<span class=g>{''.join(grey)}</span>")
                grey = []
            continue
        hat, delta = float(col["token_adv"][i, t]), float(col["delta"][i, t])
        cls = " class=m" if col["mask"][i, t] else ""
        style = f" style=background:{colour(hat - a, scale)}" if hat != a else ""
        out.append(f"<i{cls} data-d='{hat:.9g} {delta:.4g}'{style}>{piece}</i>")
    return "".join(out) + "</p></div>"


STYLE = """
body{font:14px/1.5 system-ui,sans-serif;margin:1em 2em;color:#111}
.grid{display:grid;gap:0 1.5em}
.ep{border-top:1px solid #ddd;padding:.3em 0;font-family:ui-monospace,monospace;font-size:13px}
.ep p{white-space:pre-wrap;margin:.2em 0}
h4{font:600 13px system-ui,sans-serif;margin:.2em 0}
.gold{color:#555;font-weight:400}
.g{color:#999}
i{font-style:normal;cursor:pointer}
i.m{text-decoration:underline dotted #888}
.ctx{display:inline-block;border:1px dashed #7a6;background:#f6fbf2;color:#476;margin:.2em 0;
     padding:0 .3em;font-size:12px}
.ctx b{display:block;font:600 11px system-ui,sans-serif;color:#476}
.col{position:sticky;top:0;background:#fff;border-bottom:2px solid #333;padding:.3em 0;z-index:1}
.scale{display:inline-block;width:12em;height:.9em;vertical-align:middle;
       background:linear-gradient(90deg,rgb(178,24,43),#fff,rgb(33,102,172))}
#tip{position:absolute;background:#222;color:#fff;padding:.4em .6em;border-radius:4px;
     font:12px/1.4 ui-monospace,monospace;white-space:pre;pointer-events:none;z-index:2}
"""

# The tooltip: a token's data-d holds "Â δ"; its episode's data-a holds A.
SCRIPT = """
const tip = document.getElementById("tip");
function show(event) {
  const token = event.target.closest("i[data-d]");
  if (!token) { tip.hidden = true; return; }
  const [hat, delta] = token.dataset.d.split(" ");
  const m = token.classList.contains("m");
  tip.textContent = "token " + JSON.stringify(token.textContent) +
    "\\nA     " + token.closest(".ep").dataset.a + "\\nÂ     " + hat + "\\nδ     " + delta +
    "\\nm     " + (m ? "yes: the teacher's gap may move it" : "no: Â = A here");
  const box = token.getBoundingClientRect();
  tip.style.left = (box.left + window.scrollX) + "px";
  tip.style.top = (box.bottom + window.scrollY + 4) + "px";
  tip.hidden = false;
}
document.addEventListener("mouseover", show);
document.addEventListener("click", show);
"""


def counts(r, adv, col):
    """What a column's header reports: generated tokens, those whose Â differs from A (the
    coloured ones), and those m covers."""
    gen = r.gen_mask.bool()
    coloured = (col["token_adv"] != adv[:, None]) & gen
    return dict(generated=int(gen.sum()), coloured=int(coloured.sum()),
                covered=int((col["mask"] & gen).sum()))


def render(tok, r, adv, cols, title):
    """The whole page: a header per column, then each episode across the columns."""
    head = []
    for label, cfg, col, c in cols:
        setting = "" if cfg["METHOD"] == "grpo" else ", " + ", ".join(
            f"{k}={cfg[k]}" for k in ("EVISD_SPAN", "EVISD_LAMBDA", "EVISD_TAU", "TEACHER_CONTEXT"))
        note = (" The gated loss leaves Â = A: its credit is a loss term beside it."
                if cfg["METHOD"] == "evisd" and cfg["EVISD_FORM"] == "gated_loss" else "")
        head.append(f"<div class=col><b>{html.escape(label)}</b><br>METHOD={cfg['METHOD']}"
                    f"{setting}<br><span class=count data-coloured={c['coloured']}>"
                    f"{c['coloured']} of {c['generated']} generated tokens coloured (Â ≠ A), "
                    f"{c['covered']} under m</span>{note}</div>")
    # The groups the teacher is asked about (A != 0 somewhere) first; a group that agrees has
    # A = 0 everywhere, and Â = A = 0 whatever the teacher says.
    size = cols[0][1]["GROUP_SIZE"]
    groups = sorted(range(0, len(adv), size), key=lambda g: not adv[g:g + size].any())
    rows = []
    for i in (g + k for g in groups for k in range(size)):
        rows += [episode_html(tok, r, i, adv, col, cfg["EVISD_LAMBDA"])
                 for _, cfg, col, _ in cols]
    legend = ("Each generated token is coloured by Â − A: <span class=scale></span> from −λ|A| "
              "(red: the teacher pushed it down) through white (untouched) to +λ|A| (blue: "
              "up). <span class=g>Grey</span>: the prompt and &lt;information&gt;, written by "
              "the environment. <span class=ctx><b>a teacher reads</b>its block</span> sits "
              "where that teacher read it. Dotted underline: m covers the token. Hover or tap "
              "a token for A, Â, δ and m.")
    return (f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style><h2>{html.escape(title)}</h2><p>{legend}</p>"
            f"<div class=grid style='grid-template-columns:repeat({len(cols)},1fr)'>"
            + "".join(head) + "".join(rows) + "</div><div id=tip hidden></div>"
            f"<script>{SCRIPT}</script></html>")


def write_page(run_dirs, path, overrides=(), seed=0):
    """Sample one step's batch with the first run's model, credit it in every column, write the
    page to ``path``; returns {column label: counts}."""
    t0 = time.perf_counter()
    cols = columns(run_dirs, list(overrides))
    _, lm, tok, cfg = cols[0]
    world, r, adv = sample_step(lm, tok, cfg, seed)
    drawn = []
    for label, column_lm, column_tok, column_cfg in cols:
        col = step_credit(column_lm.eval(), column_tok, column_cfg, world, r, adv)
        drawn.append((label, column_cfg, col, counts(r, adv, col)))
    title = (f"One step's credit: {len(adv)} episodes of {len(adv) // cfg['GROUP_SIZE']} "
             f"validation questions (seed {seed})")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(render(tok, r, adv, drawn, title))
    os.replace(path + ".tmp", path)
    for label, _, _, c in drawn:
        print(f"{label}: {c['coloured']} of {c['generated']} generated tokens coloured (Â ≠ A), "
              f"{c['covered']} under m")
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB, {len(adv)} episodes, "
          f"{time.perf_counter() - t0:.1f} s)")
    return {label: c for label, _, _, c in drawn}
