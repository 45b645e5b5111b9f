"""Tests for model.py: tokenizer, checkpoints, log-probs, rollouts and their masks."""
import time

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM, LogitsProcessor, LogitsProcessorList)

import model
import search_env
import toy_world


@pytest.fixture(scope="module")
def tok():
    return model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))


@pytest.fixture(scope="module")
def lm(tok):
    torch.manual_seed(0)
    return model.build_model(tok, "tiny").eval()


@pytest.fixture(scope="module")
def world():
    return toy_world.make_world(seed=7, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                n_companies=6)


def test_tokenizer_round_trip_and_single_token_tags(tok, world):
    text = (search_env.format_information(world.docs[:3])
            + "<think> x. </think><answer> y </answer>\n")
    assert tok.decode(tok.encode(text)) == text
    for tag in search_env.TAGS:
        assert len(tok.encode(tag)) == 1


def test_unseen_names_encode_in_familiar_pieces(tok):
    unseen = toy_world.make_world(seed=12345)          # a world the tokenizer never saw
    unk = tok.unk_token_id
    pieces = []
    for d in unseen.docs:
        ids = tok.encode(" " + d.title)
        assert unk not in ids
        pieces.append(len(ids) / len("".join(d.title.split())))
    # Byte-level would give one token per character; syllable pieces give far fewer.
    assert sum(pieces) / len(pieces) < 0.45


def test_checkpoint_reloads_with_auto_classes(tok, lm, tmp_path):
    model.save_checkpoint_dir(lm, tok, tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    lm2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    text = "where was the director of elis road born? <search> elis road </search>"
    ids = tok.encode(text)
    assert tok2.encode(text) == ids and tok2.pad_token_id == tok.pad_token_id
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(lm(x).logits, lm2(x).logits)


def _naive_logprobs(lm, ids):
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    return [0.0] + [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def test_token_logprobs_equals_naive_loop(lm):
    ids = [5, 17, 42, 99, 3, 250, 7]
    with torch.no_grad():
        got = model.token_logprobs(lm, torch.tensor([ids]),
                                   torch.ones(1, len(ids), dtype=torch.long), chunk=2)
    assert torch.allclose(got[0], torch.tensor(_naive_logprobs(lm, ids)), atol=1e-5)


def test_token_logprobs_score_mask_and_padding(lm):
    short, long = [5, 17, 42, 99], [8, 9, 10, 11, 12, 13, 14, 15]
    ids = torch.tensor([short + [0] * 4, long])
    mask = torch.tensor([[1] * 4 + [0] * 4, [1] * 8])
    with torch.no_grad():
        batched = model.token_logprobs(lm, ids, mask)
        alone = model.token_logprobs(lm, torch.tensor([short]), torch.ones(1, 4, dtype=torch.long))
        partial = model.token_logprobs(
            lm, ids, mask, score_mask=torch.tensor([[0, 0, 1, 0] + [0] * 4, [0] * 7 + [1]]))
    assert (batched[0, :4] - alone[0]).abs().max() < 1e-5
    assert (batched[0, 4:] == 0).all()
    assert partial[0, 2] == pytest.approx(batched[0, 2].item(), abs=1e-6)
    assert partial[1, 7] == pytest.approx(batched[1, 7].item(), abs=1e-6)
    assert (partial != 0).sum() == 2


def test_token_logprobs_has_gradient(lm):
    ids = torch.tensor([[5, 17, 42, 99]])
    lp = model.token_logprobs(lm, ids, torch.ones_like(ids))
    lp.sum().backward()
    assert lm.get_output_embeddings().weight.grad.abs().sum() > 0
    lm.zero_grad()


def test_gradient_checkpointing_gives_the_same_logprobs_and_gradients(tok):
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7], [8, 9, 10, 11, 12, 0, 0]])
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    runs = []
    for checkpointing in (False, True):
        lm = model.build_model(tok, "tiny").train()
        if checkpointing:          # layers and, in token_logprobs, the output head are recomputed
            model.enable_checkpointing(lm)
        lp = model.token_logprobs(lm, ids, mask, chunk=3)
        lp.sum().backward()
        runs.append((lp.detach(), [p.grad for p in lm.parameters()]))
    (lp0, g0), (lp1, g1) = runs
    assert torch.allclose(lp0, lp1, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g0, g1))


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
        for start, end, kind, _ in r.spans[i]:
            k = r.action_kind[i, start:end]
            assert (k == model.KIND_IDS.get(kind, 0)).all()
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
        r = model.rollout(policy, tok, search_env.episodes(world, qs, 3, max_turns=3),
                          max_new_tokens=24, decode="generate")
        assert r.input_ids.shape[0] == 12 and (r.turns <= 3).all() and (r.turns >= 1).all()
        assert r.questions[3] is qs[1]
        _check_masks(r, tok, world)
    assert all([k for _, _, k, _ in s] == ["invalid", "search", "answer"] for s in r.spans)
    assert r.answers == ["velmar"] * 12 and (r.turns == 3).all()
    s, e, _, _ = r.spans[0][1]
    assert tok.decode(r.input_ids[0, s:e]) == "<search> kalo mira </search>"   # junk was cut
    assert (r.action_kind[0, s:e] == model.KIND_IDS["search"]).all()


@pytest.fixture(scope="module")
def trained(tok, world):
    """A tiny model briefly fitted to expert transcripts."""
    torch.manual_seed(0)
    lm = model.build_model(tok, "tiny")
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3)
    trs = []
    for q in [q for q in world.split("train") if q.hops == 1][:6]:
        ep = toy_world.expert_episode(q, world)
        trs.append(model.encode_episode(tok, model.render_prompt(tok, q), ep.turns,
                                        ep.observations))
    b = model.collate(trs, tok.pad_token_id)
    for _ in range(60):    # enough to write tagged searches and answers
        lp = model.token_logprobs(lm, b["input_ids"], b["attention_mask"], score_mask=b["gen_mask"])
        loss = -(lp * b["gen_mask"]).sum() / b["gen_mask"].sum()
        opt.zero_grad(); loss.backward(); opt.step()
    return lm.eval()


def test_rollout_respects_max_turns(tok, lm, world):
    torch.manual_seed(1)
    r = model.rollout(lm, tok,
                      search_env.episodes(world, world.split("train")[:3], 2, max_turns=2),
                      max_new_tokens=8)
    assert (r.turns <= 2).all() and all(len(s) <= 2 for s in r.spans)


def test_rollout_is_deterministic_for_a_seed(tok, trained, world):
    qs = world.split("train")[:3]
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(model.rollout(trained, tok, search_env.episodes(world, qs, 2),
                                  max_new_tokens=24))
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    assert torch.equal(runs[0].rewards, runs[1].rewards)


@pytest.mark.parametrize("decode", ["static", "generate"])
def test_cached_rollout_matches_a_fresh_forward(tok, trained, world, decode, monkeypatch):
    """The KV cache kept across turns, the masked holes and the dropped finished rows must
    give each sequence exactly what a plain forward over its transcript gives: every greedy
    token is the argmax of the right-padded transcript's logits at its position."""
    monkeypatch.setattr(model.KVCache, "BLOCK", 16)     # the static cache grows every turn
    qs = world.split("train")[:6]
    # 1, 2 or 3 turns
    envs = [search_env.SearchEnv(world, q, max_turns=1 + i % 3) for i, q in enumerate(qs)]
    r = model.rollout(trained, tok, envs, max_new_tokens=24, greedy=True, decode=decode)
    kinds = [k for s in r.spans for _, _, k, _ in s]
    assert len(set(r.turns.tolist())) > 1                   # rows left the batch at different turns
    assert "search" in kinds and "answer" in kinds          # turns stopped at a tag
    with torch.no_grad():
        logits = trained(input_ids=r.input_ids, attention_mask=r.attention_mask).logits.float()
    gen = r.gen_mask[:, 1:].bool()
    chosen = logits[:, :-1].gather(-1, r.input_ids[:, 1:, None]).squeeze(-1)
    best = logits[:, :-1].max(-1).values
    assert gen.sum() > 50
    assert (best - chosen)[gen].max() < 1e-4


def test_encode_episode_matches_expert(tok, world):
    q = [q for q in world.split("train") if q.hops == 2][0]
    ep = toy_world.expert_episode(q, world)
    tr = model.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    assert [k for _, _, k, _ in tr.spans] == ["search", "search", "answer"]
    s, e, _, _ = tr.spans[-1]
    assert tok.decode(tr.ids[s:e]) == f"<answer> {q.answers[0]} </answer>"


def test_missing_hub_model_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="cannot be reached.*MODEL='tiny'"):
        model.load_model("no-such-org/no-such-model-xyz", local_files_only=True)  # no network


def test_an_unreachable_hub_fails_at_once(monkeypatch, tmp_path):
    """Not a directory, not cached, and the hub does not answer: one clear error, no retries."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")     # a name that never resolves
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    with pytest.raises(RuntimeError,
                       match="not in the local cache, and the Hugging Face hub cannot be reached"):
        model.load_model("no-such-org/no-such-model-xyz")
    assert time.monotonic() - started < 10


def test_the_embedded_model_starts_with_a_previous_token_head(tok):
    """Layer 0's first head attends to the previous token from init, whatever the tokens (half an
    induction head); its other heads, and a model built without it, spread attention."""
    ids = torch.tensor([tok.encode(
        "question: who founded rosloia harbor? <search> rosloia harbor </search>")])

    def previous_token_share(lm):   # per head of layer 0: mean attention on the token just before
        lm.config._attn_implementation = "eager"          # sdpa returns no attention weights
        attention = lm(ids, output_attentions=True).attentions[0][0]        # [heads, T, T]
        return [attention[h].diagonal(-1).mean().item() for h in range(attention.shape[0])]

    shares = previous_token_share(model.build_model(tok, "tiny", prev_token_init=6.0))
    assert shares[0] > 0.9 and max(shares[1:]) < 0.3, shares
    assert max(previous_token_share(model.build_model(tok, "tiny"))) < 0.3


def test_build_model_rejects_unknown_size(tok):
    with pytest.raises(ValueError, match="allowed"):
        model.build_model(tok, "huge")


# ---------------------------------------------------------------------- pretrained-style tokenizers
@pytest.fixture(scope="module")
def standin(standin_dir):
    """(model, tokenizer) of the local stand-in for a pretrained instruct model (conftest.py)."""
    lm, tok = model.load_model(standin_dir, local_files_only=True)
    return lm.eval(), tok


def policy(which, request):
    if which == "embedded":
        return request.getfixturevalue("lm"), request.getfixturevalue("tok")
    return request.getfixturevalue("standin")


def test_pretrained_tokenizer_gets_no_new_tokens(standin, standin_dir):
    lm, tok = standin
    assert (len(tok) == len(AutoTokenizer.from_pretrained(standin_dir))
            == lm.get_input_embeddings().weight.shape[0])
    assert all(len(tok.encode(tag, add_special_tokens=False)) > 1 for tag in search_env.TAGS)
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id


@pytest.mark.parametrize("which", ["embedded", "pretrained-style"])
def test_cut_turn_keeps_sampled_ids_and_cuts_after_the_stop_string(which, request):
    _, tok = policy(which, request)
    text = "<think> a naïve café </think><search> kalo mira </search>"
    ids = tok.encode(text + " junk", add_special_tokens=False)
    tokens, got = model.cut_turn(tok, ids + [tok.pad_token_id] * 3, {tok.eos_token_id},
                                 tok.pad_token_id)
    assert got == text and tokens == ids[:len(tokens)]             # a prefix of what was sampled
    assert tok.decode(tokens) == text and search_env.SEARCH_END not in tok.decode(tokens[:-1])
    start = model.action_start(tok, tokens, got, "search")
    assert tok.decode(tokens[start:]).endswith("<search> kalo mira </search>")
    assert search_env.SEARCH not in tok.decode(tokens[start + 1:])
    eos = tok.eos_token_id                                         # eos ends a turn, and is dropped
    assert model.cut_turn(tok, ids[:4] + [eos] + ids[4:], {eos}, tok.pad_token_id)[0] == ids[:4]
    # No stop string (ran to max_new_tokens): everything written is kept.
    assert model.cut_turn(tok, ids[:6], {eos}, tok.pad_token_id) == (ids[:6], tok.decode(ids[:6]))


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
    r = model.rollout(forced, tok, search_env.episodes(world, qs, 1, max_turns=2),
                      max_new_tokens=40, greedy=True, decode="generate")
    # no junk generated
    assert [tok.batch_decode(new) for new in forced.returned] == [[s, s] for s in script]
    assert r.answers == ["velmar", "velmar"] and (r.turns == 2).all()
    _check_masks(r, tok, world)
    for i in range(2):
        for (start, end, kind, turn), text in zip(r.spans[i], script):
            turn_ids = tok.encode(text, add_special_tokens=False)
            # sampled ids, as they were
            assert r.input_ids[i, end - len(turn_ids):end].tolist() == turn_ids
            # The tokens whose characters overlap the action's (from decoded prefixes) are exactly
            # the tokens marked with its kind.
            ends = [len(tok.decode(turn_ids[:j + 1])) for j in range(len(turn_ids))]
            starts, lo = [0] + ends[:-1], text.index("<" + kind + ">")
            expected = [model.KIND_IDS[kind] if e > lo else 0 for e in ends]
            assert r.action_kind[i, end - len(turn_ids):end].tolist() == expected
            assert start == end - len(turn_ids) + expected.index(model.KIND_IDS[kind])
            assert starts[expected.index(model.KIND_IDS[kind])] <= lo
    if which == "pretrained-style":
        assert len(tok.encode(search_env.SEARCH_END, add_special_tokens=False)) > 1


# ---------------------------------------------------------------------- the static decode
def rollout_both_ways(lm, tok, world, greedy, decodes=("generate", "static"), seed=5):
    """The same episodes rolled out by HF generate and by the static decode, from one seed."""
    out = []
    for decode in decodes:
        torch.manual_seed(seed)
        envs = search_env.episodes(world, world.split("train")[:6], 3, max_turns=3)
        out.append(model.rollout(lm, tok, envs, max_new_tokens=32, temperature=0.7,
                                 greedy=greedy, decode=decode))
    return out


@pytest.fixture(scope="module")
def llama(tok):
    """A small random Llama (no attention biases, its own RoPE module) on the embedded tokenizer."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(config).eval(), tok


@pytest.mark.parametrize("which", ["embedded", "pretrained-style", "llama"])
@pytest.mark.parametrize("greedy", [True, False])
def test_static_decode_samples_what_generate_samples(which, greedy, request, world, monkeypatch):
    """Same seed, same tokens: the static loop draws the same random numbers as generate for
    the same logits, stops at the same tokens, and keeps the same transcripts (embedded model:
    trained so it writes tagged actions; pretrained-style: Qwen2-shaped, tags of several
    tokens; a random Llama). A small cache block makes the cache grow mid-rollout."""
    monkeypatch.setattr(model.KVCache, "BLOCK", 16)
    lm, tok = ((request.getfixturevalue("trained"), request.getfixturevalue("tok"))
               if which == "embedded" else request.getfixturevalue(
                   "standin" if which == "pretrained-style" else "llama"))
    # Only the eos ids of the stand-in's generation config: transformers 4.56's generate lets
    # its sampling defaults (top_p 0.8, repetition penalty) override pinned values equal to
    # generate's own defaults, and then it does not sample what it was asked to.
    monkeypatch.setattr(lm, "generation_config", GenerationConfig(
        eos_token_id=lm.generation_config.eos_token_id, pad_token_id=tok.pad_token_id))
    a, b = rollout_both_ways(lm, tok, world, greedy)
    assert a.input_ids.shape == b.input_ids.shape and a.gen_mask.sum() > 200
    for field in ("input_ids", "attention_mask", "gen_mask", "info_mask", "action_kind", "turns"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.turn_texts == b.turn_texts and a.spans == b.spans
    if which == "embedded":
        kinds = [k for s in b.spans for _, _, k, _ in s]
        assert "search" in kinds and "answer" in kinds          # turns ended at stop strings
    elif which == "pretrained-style":   # its own sampling defaults back: the loop never reads them
        monkeypatch.undo()
        assert torch.equal(rollout_both_ways(lm, tok, world, greedy, ["static"])[0].input_ids,
                           b.input_ids)
    _check_masks(b, tok, world)


def test_static_decode_logprobs_are_the_training_forwards(tok, trained, world):
    """The log-probs the static loop sampled from are those train.rl_step scores the transcript
    with (token_logprobs over the right-padded batch), within 1e-4."""
    seen = []
    sample = model.sample

    def recording(logits, temperature, greedy):
        token = sample(logits, temperature, greedy)
        logp = torch.log_softmax(logits / temperature, -1).gather(-1, token[:, None])[:, 0]
        seen.extend(zip(token.tolist(), logp.tolist()))
        return token

    torch.manual_seed(3)
    envs = search_env.episodes(world, world.split("train")[:4], 2, max_turns=2)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(model, "sample", recording)
        r = model.rollout(trained, tok, envs, max_new_tokens=24, temperature=0.7)
    keep = r.gen_mask.bool()
    lp = model.token_logprobs(trained, r.input_ids, r.attention_mask, r.gen_mask,
                              temperature=0.7)[keep]
    # every kept token was drawn with the log-prob training gives it (same id, within 1e-4)
    drawn = {}
    for token, logp in seen:
        drawn.setdefault(token, []).append(logp)
    assert lp.numel() > 100
    assert all(min(abs(d - x) for d in drawn[t]) < 1e-4
               for t, x in zip(r.input_ids[keep].tolist(), lp.tolist()))


@pytest.mark.parametrize("which", ["embedded", "pretrained-style"])
def test_stop_tokens_cut_turns_as_cut_turn(which, request):
    """The static loop's stop (on token ids, decoding only a short tail after a token holding
    ">") cuts every turn where cut_turn cuts it: 400 random turns spliced from pieces that split
    the tags at every place, multi-byte characters, and random ids, eos among them."""
    lm, tok = policy(which, request)
    eos = {tok.eos_token_id}
    stops = model.stop_tokens(tok, frozenset(eos), lm.get_output_embeddings().weight.shape[0])
    pieces = ["</search>", "</answer>", "</", "search>", "</sear", "ch>", "answer>", ">", "<",
              "<search> kalo mira", "<answer> velmar", " naïve café ", "</think>", "ch", "x>",
              "</search", "/answer", " the ", "é>"]
    rng = torch.Generator().manual_seed(0)
    ids = [i for i in range(len(tok)) if i != tok.pad_token_id]   # cut_turn drops trailing pads
    checked = stopped = 0
    for _ in range(400):
        turn = []
        for _ in range(int(torch.randint(1, 12, (1,), generator=rng))):
            k = int(torch.randint(len(pieces) + 3, (1,), generator=rng))
            turn += (tok.encode(pieces[k], add_special_tokens=False) if k < len(pieces)
                     else [ids[int(torch.randint(len(ids), (1,), generator=rng))]])
        if torch.rand(1, generator=rng) < 0.1:
            turn.insert(int(torch.randint(len(turn) + 1, (1,), generator=rng)), tok.eos_token_id)
        # the loop's walk: a row ends at eos (dropped) or at the token completing a stop string
        end = len(turn)
        for t, token in enumerate(turn):
            if stops.eos[token]:
                end = t
                break
            if stops.may_stop[token] and stops.stops(tok, turn[:t + 1]):
                end = t + 1
                break
        text = tok.decode(turn[:end])
        assert (turn[:end], text[:model.stop_end(text)]) == model.cut_turn(
            tok, turn, eos, tok.pad_token_id), turn
        checked += 1
        stopped += model.stop_end(text) is not None
    assert checked == 400 and 100 < stopped < 400


def test_static_decode_refuses_a_model_it_cannot_run(tok, world):
    with pytest.raises(ValueError, match="use DECODE='generate'"):
        model.rollout(ScriptedLM(tok), tok, search_env.episodes(world, world.split("train")[:1], 1))
