"""The network: the embedded tokenizer (each protocol tag one token) and model, HF models (their
tags plain text), the prompt before the first turn (rollout.py plays the turns), log-probs."""
import contextlib
import json
import os
import socket
import sys
import urllib.parse
import warnings

import torch
import safetensors.torch
from torch.utils.checkpoint import checkpoint
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                          logging as transformers_logging)

from search_env import INSTRUCTION, INVALID_OBSERVATION, TAGS, Question, format_information
from toy_world import SYLLABLES, expert_episode, make_world

# transformers' progress bars and notices would bury the run's own output; its errors still show.
transformers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()
# PEFT still reads an attribute that transformers 5 renamed, and each read warns.
warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)

# hidden, layers, heads, kv heads, mlp width (why these: docs/design-notes.md)
SIZES = {"tiny": (128, 3, 4, 2, 256), "small": (256, 6, 8, 4, 768), "base": (512, 8, 8, 4, 1536)}


# ----------------------------------------------------------------------------- tokenizer
def tokenizer_texts(seeds=(0, 1, 2, 3)):
    """The tokenizer's text: a few worlds' documents, questions and expert turns; each syllable."""
    texts = [INSTRUCTION, " ".join(SYLLABLES), INVALID_OBSERVATION]
    for seed in seeds:
        world = make_world(seed=seed)
        texts += [format_information(world.docs[i:i + 3]) for i in range(0, len(world.docs), 3)]
        for q in world.questions[::4]:
            texts += [render_prompt(None, q)] + expert_episode(q, world).turns
    return texts


def build_tokenizer(texts, vocab_size=768):
    """A byte-level BPE as an HF fast tokenizer: any string encodes and decodes back exactly; a
    small vocabulary spells an unseen name from the syllable pieces the model learns to copy."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    # Tags are plain (non-special) added tokens: one id each, and kept by decode().
    tok.add_tokens([AddedToken(t, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


# ----------------------------------------------------------------------------- models
def build_model(tokenizer, size="tiny", seed=0, prev_token_init=0.0):
    """A random Qwen2 LM of ``SIZES[size]``, with a ``prev_token_head`` if ``prev_token_init``."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; allowed: {sorted(SIZES)}")
    hidden, layers, heads, kv_heads, mlp = SIZES[size]
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    if prev_token_init:
        prev_token_head(model, prev_token_init)
    return model


def prev_token_head(model, scale, back=1, frequencies=4):
    """Layer 0's first head attends ``back`` tokens earlier, whatever the tokens: half the induction
    head that copies a name, which a random model grows late, by luck. RoPE turns pair (j, j + d/2)
    by position * theta_j, so key bias (scale, 0) and query bias scale * e^(-i back theta_j) on the
    fastest pairs score key n for query m by scale^2 * sum_j cos((m - n - back) theta_j)."""
    attn = model.model.layers[0].self_attn
    d, theta = attn.head_dim, model.model.rotary_emb.inv_freq[:frequencies]
    with torch.no_grad():   # the biases start at 0
        attn.k_proj.bias[:frequencies] = scale
        attn.q_proj.bias[:frequencies] = scale * torch.cos(back * theta)
        attn.q_proj.bias[d // 2:d // 2 + frequencies] = -scale * torch.sin(back * theta)


def without_dropout(lm):
    """``lm`` with every dropout off, as in TRL: RL scores student, teacher and reference in train
    mode (gradient checkpointing acts only there), where a dropout would make the gap noise."""
    for module in lm.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(getattr(module, "attention_dropout", None), float):   # inside SDPA
            module.attention_dropout = 0.0
    return lm


def load_model(name, dtype=None, local_files_only=None):
    """(model, tokenizer) from a directory or hub name: the local cache first, then the hub; a
    LoRA checkpoint is its base (named in adapter_config.json) with the adapter on top."""
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
    if os.path.exists(adapter := os.path.join(name, "adapter_config.json")):
        base = load_model(json.load(open(adapter))["base_model_name_or_path"], dtype,
                          local_files_only)[0]
        from peft import PeftModel     # here, not at the top: its import takes seconds
        lora = PeftModel.from_pretrained(base, name, is_trainable=True)
        lora.name_or_path = name    # where it was read from, not its base's (PEFT's pass-through)
        return lora, AutoTokenizer.from_pretrained(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=True)
    except OSError as e:
        if os.path.isdir(name):
            raise
        if local_files_only or not _hub_answers():
            raise RuntimeError(
                f"could not load model {name!r}: it is not a local directory, not in the "
                "local cache, and the Hugging Face hub cannot be reached. Download it on a machine "
                "with internet access and pass its directory, or use the embedded default with "
                f"MODEL='tiny'. (cause: {type(e).__name__}: {str(e).splitlines()[0]})") from None
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    # Tags stay text, as in Search-R1: new tokens would be untrained embeddings. eos pads.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Only its bos, eos and pad ids are kept: on transformers 4.50-4.57 an instruct model's own
    # do_sample, top_k, top_p, repetition penalty override what rollout passes generate.
    own = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id, pad_token_id=own.pad_token_id)
    return model, tokenizer


def read_weights(path):
    """(weights, config) of a checkpoint directory, to copy into the policy: a LoRA one's adapter
    alone, no config (the policy holds the base already: no second copy of a 7B base)."""
    if os.path.exists(os.path.join(path, "adapter_config.json")):
        return safetensors.torch.load_file(os.path.join(path, "adapter_model.safetensors")), None
    lm = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return lm.state_dict(), lm.config


def put_weights(lm, weights):
    """Copy read_weights' weights into ``lm`` in place (a LoRA model: into its adapter)."""
    if not is_lora(lm):
        return lm.load_state_dict(weights)
    from peft import set_peft_model_state_dict
    if unexpected := set_peft_model_state_dict(lm, weights).unexpected_keys:
        raise KeyError(f"the adapter has no {sorted(unexpected)[0]}")


def _hub_answers(timeout=3.0):
    """Whether the hub (or HF_ENDPOINT) answers within ``timeout`` s, so offline fails at once."""
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    with contextlib.suppress(OSError):
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    return False


# ----------------------------------------------------------------------------- LoRA
# Every projection of attention and of the MLP, as "LoRA Without Regret" (2025) found best for RL.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def add_lora(lm, rank, alpha, base_dtype, base_name, seed=0):
    """``lm`` as a PEFT LoRA model: its weights frozen in ``base_dtype`` (the compute dtype: only
    the adapters train), float32 adapters whose B starts at 0, so it starts as exactly ``lm``."""
    from peft import LoraConfig, get_peft_model
    lm.to(base_dtype)
    lm.name_or_path = base_name     # adapter_config.json names it, so load_model finds the base
    torch.manual_seed(seed)         # A's random start, whatever ran before (a warm-up, or none)
    lora = get_peft_model(lm, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                         target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    for p in lora.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return lora


def is_lora(lm):
    """Whether ``lm`` is a PEFT model; never while peft is not imported (a run without LoRA)."""
    return "peft" in sys.modules and isinstance(lm, sys.modules["peft"].PeftModel)


def without_adapter(lm):
    """A context in which ``lm`` is its base model: a LoRA model's adapter off; any other as is."""
    lora = "peft" in sys.modules and isinstance(lm, sys.modules["peft"].PeftModel)   # is_lora
    return lm.disable_adapter() if lora else contextlib.nullcontext()


def autocast(device, dtype):
    """bf16 autocast where DTYPE asks, on the CPU too (so it runs the GPU's path); fp32 weights."""
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32)


def save_checkpoint_dir(model, tokenizer, path):
    """An HF directory: the model (a LoRA model: its adapter alone) and the tokenizer."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def render_prompt(tokenizer, question):
    """The instruction and the question, through the tokenizer's chat template if it has one."""
    text = question.question if isinstance(question, Question) else str(question)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": INSTRUCTION},
                    {"role": "user", "content": f"question: {text}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{INSTRUCTION}\nquestion: {text}\n"


# ----------------------------------------------------------------------------- log-probs
def token_logprobs(model, input_ids, attention_mask, score_mask=None, chunk=4096, temperature=1.0):
    """log p(token_t | tokens_<t) [N, T], 0 at position 0 and where ``score_mask`` is 0. The output
    head runs only there, a chunk of rows at a time (gather - logsumexp, no [N, T, V] log-softmax),
    so a large vocabulary fits; under gradient checkpointing the backward recomputes each chunk."""
    decoder = model.get_decoder()
    # No KV cache in a scoring forward: it would only hold every layer's keys and values.
    hidden = decoder(input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    select = (attention_mask if score_mask is None else score_mask)[:, 1:].bool()  # [N, T-1]
    h = hidden[:, :-1][select]                                 # [M, d] the states predicting them
    targets = input_ids[:, 1:][select]                         # [M]
    head = model.get_output_embeddings()
    rows = min(chunk, max(1, 2**27 // head.weight.shape[0]))   # <= 2^27 logits (512 MB fp32)
    recompute = (torch.is_grad_enabled() and model.training
                 and getattr(decoder, "gradient_checkpointing", False))
    pieces = []
    for s in range(0, h.shape[0], rows):
        args = (head, h[s:s + rows], targets[s:s + rows], temperature)
        pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute
                      else _chunk_logprobs(*args))
    logp = torch.cat(pieces) if pieces else h.new_zeros(0, dtype=torch.float32)
    out = torch.zeros(select.shape, dtype=torch.float32, device=input_ids.device)
    return torch.nn.functional.pad(out.masked_scatter(select, logp), (1, 0))  # [N, T]


def _chunk_logprobs(head, h, targets, temperature):
    logits = head(h).float() / temperature                     # [chunk, V]
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def enable_checkpointing(model):
    """Recompute each decoder layer's activations in the backward pass: compute for memory."""
    # the renamed method in transformers 5; the kwargs dict either way
    enable = (getattr(model, "activation_checkpointing_enable", None)
              or model.gradient_checkpointing_enable)
    enable({"use_reentrant": False})
