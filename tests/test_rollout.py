"""Tests for rollout.py: rollouts, their masks and the action ranges recorded as turns are cut;
transcripts of text episodes. Its fixtures (tokenizers, models, a world) are conftest.py's."""
import json
import os
import random

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

import evaluate
import model
import rollout
import search_env
import toy_world
import train


def policy(which, request):
    if which == "embedded":
        return request.getfixturevalue("lm"), request.getfixturevalue("tok")
    return request.getfixturevalue("standin")


def _check_masks(r, tok, world):
    N, T = r.input_ids.shape
    assert r.gen_mask.shape == r.info_mask.shape == r.action_kind.shape == (N, T)
    assert not (r.gen_mask & r.info_mask).any()
    assert ((r.action_kind > 0) <= r.gen_mask.bool()).all()
    assert ((r.gen_mask | r.info_mask) <= r.attention_mask).all()
    for i in range(N):
        p = int(r.prompt_len[i])
        assert r.gen_mask[i, :p].sum() == 0 and r.info_mask[i, :p].sum() == 0
        assert r.gen_mask[i, p] == 1  # the first thing after the prompt is generated
        for span in r.spans[i]:
            start, end, kind = span.action, span.end, span.kind
            k = r.action_kind[i, start:end]
            assert (k == rollout.KIND_IDS.get(kind, 0)).all()
            if kind != "invalid":
                text = tok.decode(r.input_ids[i, start:end])
                assert search_env.parse_action(text).kind == kind
                # Exact: the first token holds the start of the opening tag, the last the end of
                # the closing one (with a tag of several tokens, neither may be left out).
                open_tag, close_tag = ((search_env.SEARCH, search_env.SEARCH_END)
                                       if kind == "search"
                                       else (search_env.ANSWER, search_env.ANSWER_END))
                assert open_tag not in tok.decode(r.input_ids[i, start + 1:end])
                assert close_tag not in tok.decode(r.input_ids[i, start:end - 1])
        # Each observation, decoded from its info tokens, is exactly what the env returned.
        info = r.info_mask[i].bool()
        runs, cur = [], []
        for t in range(T):
            if info[t]:
                cur.append(int(r.input_ids[i, t]))
            elif cur:
                runs.append(cur); cur = []
        if cur:
            runs.append(cur)
        for run in runs:
            obs = tok.decode(run)
            assert (obs == search_env.INVALID_OBSERVATION
                    or obs.startswith(search_env.INFO) and obs.endswith(search_env.INFO_END))
        assert len(runs) == max(0, int(r.turns[i]) - 1)


class ScriptedLM(torch.nn.Module):
    """A stand-in policy whose generate() writes a fixed script: an invalid turn, a search,
    then an answer, each followed by junk after the stop token (which rollout must cut)."""

    def __init__(self, tok):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok = tok
        self.script = ["<think> hmm </think> no tag",
                       "<think> i need x. </think><search> kalo mira </search>",
                       "<think> ok. </think><answer> velmar </answer>"]

    def generate(self, input_ids, attention_mask, generation_config, **cache):
        info = self.tok.convert_tokens_to_ids(search_env.INFO)
        rows = []
        for row in input_ids.tolist():
            turn = min(row.count(info), 2)
            rows.append(self.tok.encode(self.script[turn]) + ([] if turn == 0 else [7, 8]))
        width = max(map(len, rows))
        new = [r + [self.tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


def test_rollout_masks_on_random_and_scripted_models(tok, lm, world):
    qs = world.split("train")[:4]
    for policy in (lm, ScriptedLM(tok)):
        torch.manual_seed(0)
        r = rollout.rollout(policy, tok, search_env.episodes(world, qs, 3, max_turns=3),
                          max_new_tokens=24)
        assert r.input_ids.shape[0] == 12 and (r.turns <= 3).all() and (r.turns >= 1).all()
        assert r.questions[3] is qs[1]
        _check_masks(r, tok, world)
    assert all([span.kind for span in s] == ["invalid", "search", "answer"] for s in r.spans)
    assert r.answers == ["velmar"] * 12 and (r.turns == 3).all()
    s, e = r.spans[0][1].action, r.spans[0][1].end
    assert tok.decode(r.input_ids[0, s:e]) == "<search> kalo mira </search>"   # junk was cut
    assert (r.action_kind[0, s:e] == rollout.KIND_IDS["search"]).all()


def test_rollout_respects_max_turns(tok, lm, world):
    torch.manual_seed(1)
    r = rollout.rollout(lm, tok,
                      search_env.episodes(world, world.split("train")[:3], 2, max_turns=2),
                      max_new_tokens=8)
    assert (r.turns <= 2).all() and all(len(s) <= 2 for s in r.spans)


def test_rollout_is_deterministic_for_a_seed(tok, trained, world):
    qs = world.split("train")[:3]
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(rollout.rollout(trained, tok, search_env.episodes(world, qs, 2),
                                  max_new_tokens=24))
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    assert torch.equal(runs[0].rewards, runs[1].rewards)


def greedy_tokens_are_a_fresh_forwards_argmax(play, tok, trained, world):
    """Every greedy token ``play`` (rollout.rollout, or the lab's fast decode) writes is the
    argmax of a plain forward over its right-padded transcript, at its position; the episodes
    end after 1, 2 or 3 turns, so rows leave the batch at different turns."""
    qs = world.split("train")[:6]
    envs = [search_env.SearchEnv(world, q, max_turns=1 + i % 3) for i, q in enumerate(qs)]
    r = play(trained, tok, envs, max_new_tokens=24, greedy=True)
    kinds = [span.kind for s in r.spans for span in s]
    assert len(set(r.turns.tolist())) > 1                   # rows left the batch at different turns
    assert "search" in kinds and "answer" in kinds          # turns stopped at a tag
    with torch.no_grad():
        logits = trained(input_ids=r.input_ids, attention_mask=r.attention_mask).logits.float()
    gen = r.gen_mask[:, 1:].bool()
    chosen = logits[:, :-1].gather(-1, r.input_ids[:, 1:, None]).squeeze(-1)
    best = logits[:, :-1].max(-1).values
    assert gen.sum() > 50
    assert (best - chosen)[gen].max() < 1e-4
    return r


def test_left_padded_turns_match_a_fresh_forward(tok, trained, world):
    """Each turn's left padding and the finished rows left out of the batch must give each
    sequence exactly what a plain forward over its right-padded transcript gives."""
    greedy_tokens_are_a_fresh_forwards_argmax(rollout.rollout, tok, trained, world)


def instruct_defaults(standin_dir):
    """The stand-in's generation_config.json, as an instruct checkpoint saved by transformers >=
    4.50 ships it: generate on 4.50-4.57 reads it wherever a passed value is the library default."""
    with open(os.path.join(standin_dir, "generation_config.json")) as f:
        saved = json.load(f)
    stamp = tuple(int(x) for x in saved["transformers_version"].split(".")[:2])
    assert stamp >= (4, 50) and saved["do_sample"] is True
    assert (saved["temperature"], saved["top_k"], saved["top_p"]) == (0.7, 20, 0.8)
    assert saved["repetition_penalty"] == 1.05


def test_greedy_on_an_instruct_checkpoint_is_argmax_whatever_its_sampling_defaults(
        standin, standin_dir, world):
    """Greedy decoding (evaluation's) of a checkpoint that ships sampling defaults: the same
    transcripts under three torch seeds, each token a fresh forward's argmax (no repetition
    penalty), and the same EM from evaluate's greedy episodes twice."""
    instruct_defaults(standin_dir)
    lm, tok = standin
    qs = world.split("train")[:4]
    played = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        played.append(rollout.rollout(lm, tok, search_env.episodes(world, qs, 1, max_turns=2),
                                      max_new_tokens=16, greedy=True))
    r = played[0]
    assert all(torch.equal(p.input_ids, r.input_ids) and p.turn_texts == r.turn_texts
               for p in played[1:])
    with torch.no_grad():
        logits = lm(input_ids=r.input_ids, attention_mask=r.attention_mask).logits.float()
    gen = r.gen_mask[:, 1:].bool()
    chosen = logits[:, :-1].gather(-1, r.input_ids[:, 1:, None]).squeeze(-1)
    assert gen.sum() > 40
    assert (logits[:, :-1].max(-1).values - chosen)[gen].max() < 1e-4
    cfg = dict(train.DEFAULTS, MAX_TURNS=2, MAX_NEW_TOKENS=16)
    ems = [evaluate.greedy_episodes(lm, tok, cfg, world, qs)[1] for _ in range(2)]
    assert ems[0] == ems[1]


def test_sampling_on_an_instruct_checkpoint_draws_from_softmax_of_logits_over_t(
        standin, standin_dir, world, monkeypatch):
    """The rollout's first draw of each episode is from softmax(logits / T) of a fresh forward
    over its prompt, exactly: no top_k, top_p or repetition penalty from the checkpoint."""
    instruct_defaults(standin_dir)
    lm, tok = standin
    drawn_from, multinomial = [], torch.multinomial

    def recorded(probs, *args, **kwargs):
        drawn_from.append(probs.detach().float().clone())
        return multinomial(probs, *args, **kwargs)
    monkeypatch.setattr(torch, "multinomial", recorded)
    qs = world.split("train")[:3]
    rollout.rollout(lm, tok, search_env.episodes(world, qs, 1, max_turns=1), max_new_tokens=2,
                    temperature=0.5)
    assert drawn_from, "generate drew no sample through torch.multinomial"
    for i, q in enumerate(qs):
        prompt = tok.encode(model.render_prompt(tok, q), add_special_tokens=False)
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([prompt])).logits[0, -1].float()
        want = torch.softmax(logits / 0.5, -1)
        assert (drawn_from[0][i] > 0).sum() == len(want)     # no token cut off (top_k, top_p)
        assert torch.allclose(drawn_from[0][i], want, atol=1e-6, rtol=1e-4)


def test_encode_episode_matches_expert(tok, world):
    q = [q for q in world.split("train") if q.hops == 2][0]
    ep = toy_world.expert_episode(q, world)
    tr = rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    assert [span.kind for span in tr.spans] == ["search", "search", "answer"]
    s, e = tr.spans[-1].action, tr.spans[-1].end
    assert tok.decode(tr.ids[s:e]) == f"<answer> {q.answers[0]} </answer>"


@pytest.mark.parametrize("which", ["embedded", "pretrained-style"])
def test_cut_turn_keeps_sampled_ids_and_cuts_after_the_stop_string(which, request):
    _, tok = policy(which, request)
    text = "<think> a naïve café </think><search> kalo mira </search>"
    ids = tok.encode(text + " junk", add_special_tokens=False)
    tokens, got = rollout.cut_turn(tok, ids + [tok.pad_token_id] * 3, {tok.eos_token_id},
                                   tok.pad_token_id)
    assert got == text and tokens == ids[:len(tokens)]             # a prefix of what was sampled
    assert tok.decode(tokens) == text and search_env.SEARCH_END not in tok.decode(tokens[:-1])
    start, first, last = rollout.action_ranges(tok, tokens, got, search_env.parse_action(got))
    assert tok.decode(tokens[start:]).endswith("<search> kalo mira </search>")
    assert search_env.SEARCH not in tok.decode(tokens[start + 1:])
    assert tok.decode(tokens[first:last]).strip() == "kalo mira"
    eos = tok.eos_token_id                                         # eos ends a turn, and is dropped
    assert rollout.cut_turn(tok, ids[:4] + [eos] + ids[4:], {eos}, tok.pad_token_id)[0] == ids[:4]
    # No stop string (ran to max_new_tokens): everything written is kept.
    assert rollout.cut_turn(tok, ids[:6], {eos}, tok.pad_token_id) == (ids[:6], tok.decode(ids[:6]))


class Force(LogitsProcessor):
    """Make generate() write ``script`` after column ``start``, then the last token forever."""

    def __init__(self, script, start):
        self.script, self.start = script, start

    def __call__(self, input_ids, scores):
        k = min(input_ids.shape[1] - self.start, len(self.script) - 1)
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.script[k]] = 0.0
        return forced


class ForcedLM(torch.nn.Module):
    """A real HF model whose generate() is forced to write one scripted turn per call followed
    by junk, so the real stop strings, KV cache and padding decide where each turn ends."""

    def __init__(self, lm, tok, turns):
        super().__init__()
        self.lm, self.generation_config = lm, lm.generation_config
        self.turns = [tok.encode(t + " and junk after it", add_special_tokens=False) for t in turns]
        self.returned = []                    # the new tokens of each generate() call

    def generate(self, input_ids, **kw):
        start = input_ids.shape[1]
        force = LogitsProcessorList([Force(self.turns[len(self.returned)], start)])
        out = self.lm.generate(input_ids=input_ids, logits_processor=force, **kw)
        self.returned.append(out[:, start:])
        return out


@pytest.mark.parametrize("which", ["embedded", "pretrained-style"])
def test_rollout_stops_at_stop_strings_with_exact_spans(which, request, world):
    """One code path for a tag of one token (embedded) and of several (pretrained): generate
    stops right after the token that completes </search> or </answer>, the sampled ids are kept,
    and action_kind covers exactly the tokens that overlap <search> ... </search>."""
    lm, tok = policy(which, request)
    script = ["<think> i need x. </think><search> kalo mira </search>",
              "<think> ok. </think><answer> velmar </answer>"]
    forced = ForcedLM(lm, tok, script)
    qs = world.split("train")[:2]
    r = rollout.rollout(forced, tok, search_env.episodes(world, qs, 1, max_turns=2),
                      max_new_tokens=40, greedy=True)
    # no junk generated
    assert [tok.batch_decode(new) for new in forced.returned] == [[s, s] for s in script]
    assert r.answers == ["velmar", "velmar"] and (r.turns == 2).all()
    _check_masks(r, tok, world)
    for i in range(2):
        for span, text in zip(r.spans[i], script):
            start, end, kind = span.action, span.end, span.kind
            turn_ids = tok.encode(text, add_special_tokens=False)
            # sampled ids, as they were
            assert r.input_ids[i, end - len(turn_ids):end].tolist() == turn_ids
            # The tokens whose characters overlap the action's (from decoded prefixes) are exactly
            # the tokens marked with its kind.
            ends = [len(tok.decode(turn_ids[:j + 1])) for j in range(len(turn_ids))]
            starts, lo = [0] + ends[:-1], text.index("<" + kind + ">")
            expected = [rollout.KIND_IDS[kind] if e > lo else 0 for e in ends]
            assert r.action_kind[i, end - len(turn_ids):end].tolist() == expected
            assert start == end - len(turn_ids) + expected.index(rollout.KIND_IDS[kind])
            assert starts[expected.index(rollout.KIND_IDS[kind])] <= lo
    if which == "pretrained-style":
        assert len(tok.encode(search_env.SEARCH_END, add_special_tokens=False)) > 1


# ---------------------------------------------------------------------- the recorded ranges
def decoded_ranges(tok, turn_ids, kind):
    """The ranges as this project found them before the rollout recorded them, by decoding
    again: the action from the last opening tag in the turn's text (model.action_start), its
    content from the tags found in the decoded action span alone (model.tag_length,
    evisd.content_range). Offsets in the turn: (action, content_start, content_end)."""
    opening, closing = ((search_env.SEARCH, search_env.SEARCH_END) if kind == "search"
                        else (search_env.ANSWER, search_env.ANSWER_END))
    action = rollout.token_at(tok, turn_ids, tok.decode(turn_ids).rindex(opening))
    span = turn_ids[action:]
    text = tok.decode(span)
    first = rollout.token_at(tok, span, text.index(opening) + len(opening) - 1) + 1
    at = text.find(closing, text.index(opening))
    end = rollout.token_at(tok, span, at) if at >= 0 else len(span)
    return action, action + first, action + max(first, end)


def spliced_turns(tok, n, seed):
    """``n`` turns as a sampler may write them: random pieces, each encoded on its own (so tags
    and words split where the sampler splits them, not where encode would), among them tags cut
    in two, multi-byte characters and random ids; cut as the rollout cuts a turn."""
    rng = random.Random(seed)
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "<sear", "ch>", "</sear", "</",
              "answer>", "<think> hmm </think>", " kalo mira", " velmar", " naïve café", "é",
              " x", ">", "<", " ", "  ", "ch", "n>", "ér", "mira</", "search> ", " </", "answ"]
    ids = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    turns = []
    while len(turns) < n:
        turn = [] if rng.random() < 0.5 else tok.encode("<think> a </think>",
                                                        add_special_tokens=False)
        opening = rng.choice(["<search>", "<answer>"])
        for piece in ([opening] + [rng.choice(pieces) if rng.random() < 0.8 else None
                                   for _ in range(rng.randrange(1, 6))]
                      + [opening.replace("<", "</")]):
            turn += ([rng.choice(ids)] if piece is None
                     else tok.encode(piece, add_special_tokens=False))
        tokens, text = rollout.cut_turn(tok, turn, {tok.eos_token_id}, tok.pad_token_id)
        turns.append((tokens, text))
    return turns


@pytest.mark.parametrize("which", ["embedded", "pretrained-style"])
def test_recorded_ranges_are_those_decoding_found(which, request, world):
    """The ranges the rollout records from the env's parse (rollout.action_ranges) equal those
    the project found by decoding each span again, over 600 spliced turns (tags split at every
    place, multi-byte characters, random ids) and over rollouts of a model sampled at T = 1;
    a token holding part of a tag counts as the tag's."""
    lm, tok = ((request.getfixturevalue("trained"), request.getfixturevalue("tok"))
               if which == "embedded" else request.getfixturevalue("standin"))
    turns = spliced_turns(tok, 600, seed=0)
    for seed in range(3):
        torch.manual_seed(seed)
        r = rollout.rollout(lm, tok, search_env.episodes(world, world.split("train")[:8], 4),
                            max_new_tokens=32, temperature=1.0)
        turns += [(r.input_ids[i, s.start:s.end].tolist(), r.turn_texts[i][s.turn])
                  for i in range(len(r.spans)) for s in r.spans[i]]
    checked = {"search": 0, "answer": 0}
    for tokens, text in turns:
        action = search_env.parse_action(text)
        if action.kind not in checked:
            assert rollout.action_ranges(tok, tokens, text, action) is None
            continue
        got = rollout.action_ranges(tok, tokens, text, action)
        assert got == decoded_ranges(tok, tokens, action.kind), (tokens, text)
        checked[action.kind] += 1
    assert min(checked.values()) > 50, checked
