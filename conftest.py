"""Shared fixtures: a local stand-in for a pretrained instruct model, built without a download;
and the device the tests that take one run on (``DEVICE=cuda python -m pytest``; the CPU by
default), which lab/gpu_check.py uses on a GPU machine. Here, at the root, they serve tests/ and
lab/tests/ alike, with the small tokenizer, world and models many test files share."""
import importlib.util
import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import model
import rollout
import toy_world

DEVICE = os.environ.get("DEVICE", "cpu")
# LoRA's package is not among the design card's (torch, transformers, numpy, tqdm, pytest): where
# it is missing, CI's card-packages pass skips what LoRA needs.
needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason="LoRA needs peft, which this environment lacks")

# ChatML, the template of the Qwen instruct models.
CHAT_TEMPLATE = ("{% for m in messages %}"
                 "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_standin(path):
    """A local HF directory that behaves like a pretrained instruct model where this project
    cares: a byte-level BPE tokenizer with no protocol tag in its vocabulary (each tag is
    several tokens, as `</search>` is in Qwen's), ChatML special tokens, a chat template, eos
    different from pad, a generation config with an instruct model's sampling defaults and
    two eos ids, and a small random Qwen2 causal LM saved with save_pretrained."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(model.tokenizer_texts(seeds=(0,)), trainers.BpeTrainer(
        vocab_size=1024, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True,
                         max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(config)
    lm.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, tok.pad_token_id],
                                            pad_token_id=tok.pad_token_id, do_sample=True,
                                            temperature=0.7, top_k=20, top_p=0.8,
                                            repetition_penalty=1.05)
    lm.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def standin_dir(tmp_path_factory):
    return build_standin(tmp_path_factory.mktemp("standin-instruct"))


# ----------------------------------------------------------------------------- shared fixtures
# Here, not in a test file: a session fixture imported into several files is built once per file.
@pytest.fixture(scope="session")
def tok():
    return model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))


@pytest.fixture(scope="session")
def lm(tok):
    torch.manual_seed(0)
    return model.build_model(tok, "tiny").eval()


@pytest.fixture(scope="session")
def world():
    return toy_world.make_world(seed=7, n_people=20, n_cities=8, n_countries=3, n_films=8,
                                n_companies=6)


@pytest.fixture(scope="session")
def trained(tok, world):
    """A tiny model briefly fitted to expert transcripts."""
    torch.manual_seed(0)
    lm = model.build_model(tok, "tiny")
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3)
    trs = []
    for q in [q for q in world.split("train") if q.hops == 1][:6]:
        ep = toy_world.expert_episode(q, world)
        trs.append(rollout.encode_episode(tok, model.render_prompt(tok, q), ep.turns,
                                        ep.observations))
    b = rollout.collate(trs, tok.pad_token_id)
    for _ in range(60):    # enough to write tagged searches and answers
        lp = model.token_logprobs(lm, b["input_ids"], b["attention_mask"], score_mask=b["gen_mask"])
        loss = -(lp * b["gen_mask"]).sum() / b["gen_mask"].sum()
        opt.zero_grad(); loss.backward(); opt.step()
    return lm.eval()


@pytest.fixture(scope="session")
def standin(standin_dir):
    """(model, tokenizer) of the local stand-in for a pretrained instruct model (conftest.py)."""
    lm, tok = model.load_model(standin_dir, local_files_only=True)
    return lm.eval(), tok
