"""Tests for model.py: tokenizer, checkpoints, log-probs, the embedded model and HF loading."""
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import model
import search_env
import toy_world


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


def test_pretrained_tokenizer_gets_no_new_tokens(standin, standin_dir):
    lm, tok = standin
    assert (len(tok) == len(AutoTokenizer.from_pretrained(standin_dir))
            == lm.get_input_embeddings().weight.shape[0])
    assert all(len(tok.encode(tag, add_special_tokens=False)) > 1 for tag in search_env.TAGS)
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
