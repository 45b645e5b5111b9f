"""Tests for warmup.py: reproducible for a seed, cached by everything it depends on, and its
batches (the demonstrator's habits, repeated worlds, the context mask)."""
import json
import os

import torch

import model
import rollout
import toy_world
import train
import warmup
from test_train import TINY

CFG = train.configure(["--DEVICE=cpu"])[0]   # train.py's defaults, every "auto" resolved


def warmup_batch(cfg, tok, step, privileged_frac):
    return warmup.batch(dict(cfg, SFT_PRIVILEGED_FRAC=privileged_frac), tok, step)


def test_a_warmup_is_reproducible_for_its_seed(tmp_path):
    """Same seed (and torch version and thread count): the same losses and the same weights;
    another seed: others."""
    def warm_up(seed, where):
        cfg, _, _ = train.configure(TINY + [f"--SEED={seed}", f"--SFT_DIR={tmp_path}/{where}",
                                            "--DEVICE=cpu"])
        lm, tok = train.build_policy(cfg, torch.device("cpu"))
        path = warmup.run(cfg, lm, tok, rank=0)
        losses = torch.load(os.path.join(path, "state.pt"), weights_only=False)["losses"]
        return losses, torch.cat([p.detach().flatten() for p in lm.parameters()])
    (loss_a, w_a), (loss_b, w_b), (loss_c, w_c) = warm_up(0, "a"), warm_up(0, "b"), warm_up(1, "c")
    assert len(loss_a) == 4 and loss_a == loss_b and torch.equal(w_a, w_b)
    assert loss_c != loss_a and not torch.equal(w_a, w_c)


def test_a_cached_warmup_is_keyed_by_the_embedded_models_shape_and_init(tmp_path, monkeypatch):
    """Reshaping `tiny` (as session 7 did), or changing its init (session 8), must train a new
    warm-up, not load one of another shape or one that began from other weights."""
    paths = []
    for shape, init in (((64, 2, 4, 2, 128), 6.0), ((64, 1, 4, 2, 128), 6.0),
                        ((64, 1, 4, 2, 128), 0.0)):
        cfg, _, _ = train.configure(TINY + [f"--SFT_DIR={tmp_path}/sft", "--SFT_STEPS=1",
                                            "--DEVICE=cpu", f"--PREV_TOKEN_INIT={init}"])
        monkeypatch.setitem(model.SIZES, "tiny", shape)
        lm, tok = train.build_policy(cfg, torch.device("cpu"))
        paths.append(warmup.run(cfg, lm, tok, rank=0))
        assert (json.load(open(os.path.join(paths[-1], "config.json")))["num_hidden_layers"]
                == shape[1])
    assert len(set(paths)) == 3


def test_warmup_demonstrator_has_its_habits_only_when_asked():
    cfg = dict(CFG)
    cfg.update(SFT_NOISE=0.0, SFT_BATCH=32, WORLD_SCALE=0.3)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))

    def queries(stop_early, partial_name, privileged_frac):
        cfg.update(SFT_STOP_EARLY=stop_early, SFT_PARTIAL_NAME=partial_name)
        b = warmup_batch(cfg, tok, 0, privileged_frac)
        return [[tok.decode(b["input_ids"][i, s:e]).split("<search>")[1]
                 .split("</search>")[0].split()
                 for s, e, kind in [(x.action, x.end, x.kind) for x in spans] if kind == "search"]
                for i, spans in enumerate(b["spans"])]

    searches = lambda *args: [len(q) for q in queries(*args)]
    one_word = lambda *args: sum(len(w) == 1 for q in queries(*args) for w in q)
    assert max(searches(0.0, 0.0, 0.0)) == 2          # two-hop demos search twice
    assert max(searches(1.0, 0.0, 0.0)) == 1          # ... unless they stop early
    assert max(searches(1.0, 0.0, 1.0)) == 2          # the privileged demos never do
    # Only cities have one-word names: the habit adds one-word queries, a person's first name.
    assert one_word(0.0, 1.0, 0.0) > one_word(0.0, 0.0, 0.0) + 5
    assert one_word(0.0, 1.0, 1.0) == one_word(0.0, 0.0, 1.0)   # the privileged demos: full names


def test_warmup_repeats_worlds_for_its_first_steps_only():
    """With SFT_REPEAT_STEPS=20 and SFT_REPEAT_WORLDS=10, steps 3 and 13 show questions of one
    world (other questions: each step draws its own), steps 23 and 33 of two fresh ones; with 0
    (an HF model's auto value), every step has its own world."""
    cfg = dict(CFG)
    cfg.update(SFT_BATCH=8, WORLD_SCALE=0.3, SFT_REPEAT_WORLDS=10)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))

    def texts(step, repeat_steps):
        b = warmup_batch(dict(cfg, SFT_REPEAT_STEPS=repeat_steps), tok, step, 0.0)
        return [tok.decode(ids[att.bool()])
                for ids, att in zip(b["input_ids"], b["attention_mask"])]

    # the words of the documents a step shows, against those of world 3's documents
    shown = lambda step, repeat: {
        w for t in texts(step, repeat) for block in t.split("<information>")[1:]
        for w in block.split("</information>")[0].replace(".", " ").replace(":", " ").split()}
    world3 = {w for d in toy_world.training_world("warmup", cfg["SEED"], 3, cfg["WORLD_SCALE"]).docs
              for w in (d.title + " " + d.text).replace(".", " ").replace(":", " ").split()}
    assert texts(3, 20) != texts(13, 20)                      # new questions every step
    assert shown(13, 20) <= world3 and not shown(13, 0) <= world3 and not shown(23, 20) <= world3
    # after step 20: fresh worlds
    assert texts(3, 20) == texts(3, 20) and texts(23, 20) == texts(23, 0)
    assert texts(3, 0) != texts(13, 0)
    auto = lambda model: train.configure([f"--MODEL={model}"])[0]["SFT_REPEAT_STEPS"]
    assert (train.DEFAULTS["SFT_REPEAT_STEPS"] == "auto" and auto("tiny") == 300
            and auto("some/hf-model") == 0)


def test_context_mask_covers_what_the_model_reads_and_nothing_else():
    """The warm-up's context loss is on the prompt and the documents: never on the model's own
    tokens, padding or position 0, and never on a privileged block (or the model would learn to
    write "the answer is ..." itself)."""
    cfg = dict(CFG)
    cfg.update(SFT_BATCH=8, WORLD_SCALE=0.3)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    plain, mixed = (warmup_batch(cfg, tok, 0, f) for f in (0.0, 0.5))
    for b in (plain, mixed):
        att, gen, context = b["attention_mask"], b["gen_mask"], b["context_mask"]
        assert ((context[:, 0] == 0).all() and (context[att == 0] == 0).all()
                and (context * gen).sum() == 0)
    # Without privileged demonstrations every real token but the first is read or written, once.
    assert torch.equal((plain["context_mask"] + plain["gen_mask"])[:, 1:],
                       plain["attention_mask"][:, 1:])
    # With them, exactly the inserted blocks are left out: each starts with <information> and holds
    # the golden answer ("the answer is ...") or the gold evidence.
    left_out = mixed["attention_mask"] - mixed["gen_mask"] - mixed["context_mask"]
    left_out[:, 0] = 0
    assert left_out.sum() > 0 and left_out.min() == 0
    texts = [tok.decode(mixed["input_ids"][i][left_out[i].bool()]) for i in range(len(left_out))]
    assert any("the answer is" in t for t in texts)
    assert all(t == "" or t.lstrip().startswith("<information>") for t in texts)


def test_a_privileged_demonstration_moves_the_spans_with_their_tokens():
    """Each span of a privileged demonstration holds the same tokens as before, a block at its
    first token lands before it, a block inside it (the answer block after <answer>) stays
    inside it; the blocks are read, not written."""
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    world = toy_world.make_world(seed=5, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                 n_companies=6)
    q = [q for q in world.split("train") if q.hops == 2][0]
    ep = toy_world.expert_episode(q, world)
    tr = rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns, ep.observations)
    answer = next(s for s in tr.spans if s.kind == "answer")
    out, pos = warmup.privileged_demonstration(tr, [7, 8], [9], "every", "content")
    assert len(out.ids) == len(tr.ids) + 2 * (len(tr.spans) - 1) + 1
    for old, new in zip(tr.spans, out.spans):
        for a, b, c, d in ((old.start, old.end, new.start, new.end),
                           (old.action, old.content_start, new.action, new.content_start),
                           (old.content_start, old.content_end, new.content_start,
                            new.content_end)):
            assert [out.ids[j] for j in range(c, d) if pos[j] >= 0] == tr.ids[a:b]
        assert out.ids[new.action - 2 * (new.kind == "search"):new.action] == (
            [7, 8] if new.kind == "search" else [])
    new_answer = out.spans[-1]
    assert new_answer.end - new_answer.action == answer.end - answer.action + 1
    assert out.ids[new_answer.content_start - 1] == 9            # inside the span, before content
    assert all(out.info[j] and not out.gen[j] for j, p in enumerate(pos) if p < 0)
