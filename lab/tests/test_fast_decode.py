"""Tests for lab/fast_decode.py: its rollout is called as the core's rollout.rollout is and
samples what the core's HF generate samples for a seed, from the log-probs training scores, and
its turns stop where rollout.cut_turn cuts."""
import inspect

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import model
import rollout
import search_env
from lab import fast_decode
from test_rollout import (ScriptedLM, _check_masks, greedy_tokens_are_a_fresh_forwards_argmax,
                          policy)

# train.DECODE's values: the core's rollout, and this lab file's two
PLAYS = {"generate": rollout.rollout, "static": fast_decode.decoder("static")}


def rollout_both_ways(lm, tok, world, greedy, decodes=("generate", "static"), seed=5):
    """The same episodes rolled out by the core (HF generate) and by the static decode, from one
    seed."""
    out = []
    for decode in decodes:
        torch.manual_seed(seed)
        envs = search_env.episodes(world, world.split("train")[:6], 3, max_turns=3)
        out.append(PLAYS[decode](lm, tok, envs, max_new_tokens=32, temperature=0.7,
                                 greedy=greedy))
    return out


def test_decoder_is_called_as_the_core_rollout_is():
    """train.py swaps one for the other at one place: the same parameters and defaults."""
    for name in fast_decode.NAMES:
        assert (inspect.signature(fast_decode.decoder(name))
                == inspect.signature(rollout.rollout)), name
    with pytest.raises(ValueError, match="unknown decode 'generate'.*rollout.rollout"):
        fast_decode.decoder("generate")


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
    monkeypatch.setattr(fast_decode.KVCache, "BLOCK", 16)
    lm, tok = ((request.getfixturevalue("trained"), request.getfixturevalue("tok"))
               if which == "embedded" else request.getfixturevalue(
                   "standin" if which == "pretrained-style" else "llama"))
    # The stand-in ships an instruct model's sampling defaults: neither decoder may read them.
    a, b = rollout_both_ways(lm, tok, world, greedy)
    assert a.input_ids.shape == b.input_ids.shape and a.gen_mask.sum() > 200
    for field in ("input_ids", "attention_mask", "gen_mask", "info_mask", "action_kind", "turns"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.turn_texts == b.turn_texts and a.spans == b.spans
    if which == "embedded":
        kinds = [span.kind for s in b.spans for span in s]
        assert "search" in kinds and "answer" in kinds          # turns ended at stop strings
    _check_masks(b, tok, world)


def test_the_cache_across_turns_matches_a_fresh_forward(tok, trained, world, monkeypatch):
    """The KV cache kept across turns, its masked holes and the rows dropped from it as episodes
    finish give each sequence exactly what a plain forward over its transcript gives: every
    greedy token is the argmax of the right-padded transcript's logits at its position."""
    monkeypatch.setattr(fast_decode.KVCache, "BLOCK", 16)     # the cache grows every turn
    greedy_tokens_are_a_fresh_forwards_argmax(fast_decode.decoder("static"), tok, trained, world)


def cuda_like_attention(calls):
    """scaled_dot_product_attention as some fused CUDA kernels return it: NaN in a query row
    that has nothing to attend to, and the output's memory laid out [B, q, heads, hd] (the same
    values, not contiguous). ``calls`` counts the calls and the fully masked rows seen, and
    collects the (query, key, value) dtypes."""
    real = torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        empty = torch.isneginf(attn_mask).all(-1, keepdim=True)      # [B, 1, q, 1]
        calls["calls"] += 1
        calls["empty_rows"] += int(empty.sum())
        calls["dtypes"].add((q.dtype, k.dtype, v.dtype))
        out = out.masked_fill(empty, float("nan"))
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    return attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_decode_holds_up_against_what_cuda_kernels_return(tok, trained, world, dtype,
                                                                monkeypatch):
    """Under float32 and under bf16 autocast (a GPU run's precision), the static loop samples
    what generate samples even when the attention kernel returns its output non-contiguous and
    NaN for fully masked rows: the left-padded prompt slots must not be such rows. The cache
    holds keys in the values' dtype (RoPE's float32 cos/sin must not leave them float32)."""
    cpu = torch.device("cpu")
    with model.autocast(cpu, dtype):
        expected = rollout_both_ways(trained, tok, world, greedy=False, decodes=["generate"])[0]
        calls = {"calls": 0, "empty_rows": 0, "dtypes": set()}
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            cuda_like_attention(calls))
        got = rollout_both_ways(trained, tok, world, greedy=False, decodes=["static"])[0]
    prompts = expected.prompt_len
    assert prompts.min() < prompts.max() and calls["calls"] > 100   # left padding occurred
    assert calls["empty_rows"] == 0
    assert {d for dtypes in calls["dtypes"] for d in dtypes} == {dtype}
    for field in ("input_ids", "gen_mask", "action_kind"):
        assert torch.equal(getattr(expected, field), getattr(got, field)), field
    assert expected.turn_texts == got.turn_texts


def test_static_decode_logprobs_are_the_training_forwards(tok, trained, world):
    """The log-probs the static loop sampled from are those train.rl_step scores the transcript
    with (token_logprobs over the right-padded batch), within 1e-4."""
    seen = []
    sample = fast_decode.sample

    def recording(logits, temperature, greedy):
        token = sample(logits, temperature, greedy)
        logp = torch.log_softmax(logits / temperature, -1).gather(-1, token[:, None])[:, 0]
        seen.extend(zip(token.tolist(), logp.tolist()))
        return token

    torch.manual_seed(3)
    envs = search_env.episodes(world, world.split("train")[:4], 2, max_turns=2)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fast_decode, "sample", recording)
        r = fast_decode.decoder("static")(trained, tok, envs, max_new_tokens=24, temperature=0.7)
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
    stops = fast_decode.stop_tokens(tok, frozenset(eos), lm.get_output_embeddings().weight.shape[0])
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
        assert (turn[:end], text[:search_env.stop_end(text)]) == rollout.cut_turn(
            tok, turn, eos, tok.pad_token_id), turn
        checked += 1
        stopped += search_env.stop_end(text) is not None
    assert checked == 400 and 100 < stopped < 400


def test_static_decode_refuses_a_model_it_cannot_run(tok, world):
    with pytest.raises(ValueError, match="use DECODE='generate'"):
        fast_decode.decoder("static")(ScriptedLM(tok), tok,
                                      search_env.episodes(world, world.split("train")[:1], 1))
