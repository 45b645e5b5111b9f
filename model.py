"""The policy: tokenizer and embedded default model, the HF-model path, rollouts, log-probs.

* ``build_tokenizer(texts)`` trains a small byte-level BPE on the toy world's text, so common
  words are whole tokens, names split into syllable-sized pieces, nothing is ever ``<unk>``,
  and every protocol tag is one token.
* ``build_model(tokenizer, size)`` makes a random Qwen2 causal LM, its first head optionally a
  previous-token head (``prev_token_head``); ``load_model`` loads an HF directory or hub name,
  never adding tokens: a pretrained tokenizer's tags stay plain text.
* ``rollout`` plays ``len(questions) * group_size`` search episodes as one batch per turn,
  sampled by our own loop over a pre-allocated KV cache (``decode_turn``; or by HF ``generate``),
  stopping each sequence at the strings ``</search>``/``</answer>`` or eos, found on token ids.
  Action spans are found from character offsets in the decoded text, so the same code serves a
  tag of one token (embedded tokenizer) or of several (pretrained).
* ``token_logprobs`` gives log p of each token, applying the output projection only where asked;
  ``enable_checkpointing`` trades compute for activation memory on real models.
"""
import bisect
import functools
import inspect
import os
import socket
import urllib.parse
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig,
                          GenerationMixin, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)
from transformers.utils import logging as transformers_logging

from search_env import (ANSWER, ANSWER_END, INSTRUCTION, INVALID_OBSERVATION, SEARCH, SEARCH_END,
                        TAGS, Question, format_information, parse_action, step_all)
from toy_world import SYLLABLES, expert_episode, make_world

# transformers' progress bars and notices ("Loading weights", "Writing model shards") would bury
# the run's own output; its errors still show.
transformers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
KIND_IDS = {"search": 1, "answer": 2}  # values of action_kind; 0 = not inside an action span
STOP_STRINGS = (SEARCH_END, ANSWER_END)   # a turn ends at the first of these
# generate's KV-cache argument: renamed from past_key_values to cache in transformers 5.x.
CACHE_KWARG = ("cache" if "cache" in inspect.signature(
                   GenerationMixin.prepare_inputs_for_generation).parameters
               else "past_key_values")

# hidden, layers, heads, kv heads, mlp width. tiny 0.54M parameters (its MLP twice, not three
# times, the width: it learns to copy sooner, lab/results/warmup-probes.md), small ~ 5M.
SIZES = {"tiny": (128, 3, 4, 2, 256), "small": (256, 6, 8, 4, 768), "base": (512, 8, 8, 4, 1536)}


# ----------------------------------------------------------------------------- tokenizer
def tokenizer_texts(seeds=(0, 1, 2, 3)):
    """Training text for the tokenizer: documents, questions and expert transcripts of a few
    worlds, plus every syllable on its own so each is a learnable piece."""
    texts = [INSTRUCTION, " ".join(SYLLABLES), INVALID_OBSERVATION]
    for seed in seeds:
        world = make_world(seed=seed)
        texts += [format_information(world.docs[i:i + 3]) for i in range(0, len(world.docs), 3)]
        for q in world.questions[::4]:
            ep = expert_episode(q, world)
            texts += [render_prompt(None, q)] + ep.turns
    return texts


def build_tokenizer(texts, vocab_size=768):
    """A byte-level BPE tokenizer wrapped as a Hugging Face fast tokenizer.

    Byte-level means any string encodes (no ``<unk>``) and decodes back exactly; a small
    vocabulary keeps whole names from becoming single tokens, so an unseen name is spelled
    from the same syllable pieces the model has learned to copy.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # Tags are plain (non-special) added tokens: one id each, and kept by decode().
    tok.add_tokens([AddedToken(t, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def token_at(tokenizer, ids, char):
    """Index of the token of ``ids`` whose text covers character ``char`` of ``decode(ids)``:
    the first j with ``len(decode(ids[:j + 1])) > char``, found by bisection. Prefixes are
    decoded, not single tokens: a byte-level token may hold part of a multi-byte character."""
    return bisect.bisect_right(range(len(ids)), char,
                               key=lambda j: len(tokenizer.decode(ids[:j + 1])))


# ----------------------------------------------------------------------------- models
def build_model(tokenizer, size="tiny", seed=0, prev_token_init=0.0):
    """A randomly initialised Qwen2 causal LM sized by ``SIZES[size]``; with ``prev_token_init`` > 0
    its first head starts as a previous-token head that sharp (``prev_token_head``)."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; allowed: {sorted(SIZES)}")
    hidden, layers, heads, kv_heads, mlp = SIZES[size]
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    if prev_token_init:
        prev_token_head(model, prev_token_init)
    return model


def prev_token_head(model, scale, back=1, frequencies=4):
    """Layer 0's first head attends to the token ``back`` positions earlier (1: the previous one),
    whatever the tokens: half an induction head, which copies a name read earlier; a random model
    grows one suddenly, after a plateau as long as its seed's luck (lab/results/warmup-probes.md;
    back=2 helps as much). RoPE turns pair (j, j + d/2) by position * theta_j, so key bias
    (scale, 0) and query bias scale * e^(-i back theta_j) on the fastest pairs score key n for
    query m by scale^2 * sum_j cos((m - n - back) theta_j), highest at n = m - back. All else
    starts as HF draws it."""
    attn = model.model.layers[0].self_attn
    d, theta = attn.head_dim, model.model.rotary_emb.inv_freq[:frequencies]
    with torch.no_grad():   # the biases start at 0
        attn.k_proj.bias[:frequencies] = scale
        attn.q_proj.bias[:frequencies] = scale * torch.cos(back * theta)
        attn.q_proj.bias[d // 2:d // 2 + frequencies] = -scale * torch.sin(back * theta)


def load_model(name_or_path, dtype=None, local_files_only=None):
    """(model, tokenizer) from a local HF directory or a hub name: the local cache first, then
    the hub only if it answers at all, so offline it fails at once with one clear error instead
    of ~30 s of retries. ``local_files_only`` defaults to the HF_HUB_OFFLINE variable."""
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype,
                                                     local_files_only=True)
    except OSError as e:
        if os.path.isdir(name_or_path):
            raise
        if local_files_only or not _hub_answers():
            raise RuntimeError(
                f"could not load model {name_or_path!r}: it is not a local directory, not in the "
                "local cache, and the Hugging Face hub cannot be reached. Download it on a machine "
                "with internet access and pass its directory, or use the embedded default with "
                f"MODEL='tiny'. (cause: {type(e).__name__}: {str(e).splitlines()[0]})") from None
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    # Tags stay ordinary text (Search-R1's practice): new tokens would be embeddings the
    # pretrained model has never trained. Only a pad token is needed, and eos serves.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _hub_answers(timeout=3.0):
    """Whether the Hugging Face hub (or HF_ENDPOINT) accepts a connection within ``timeout`` s."""
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def autocast(device, dtype):
    """bf16/fp16 mixed precision on CUDA; a no-op on the CPU. Weights stay float32."""
    enabled = device.type == "cuda" and dtype != torch.float32
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=enabled)


def save_checkpoint_dir(model, tokenizer, path):
    """A normal HF directory: model and tokenizer, loadable with the Auto classes."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def render_prompt(tokenizer, question):
    """The instruction and the question: plain text for the embedded model (or no tokenizer),
    or through the chat template for an instruct model that has one."""
    text = question.question if isinstance(question, Question) else str(question)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": INSTRUCTION},
                    {"role": "user", "content": f"question: {text}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{INSTRUCTION}\nquestion: {text}\n"


# ----------------------------------------------------------------------------- transcripts
class Transcript:
    """Token ids of one episode with its masks, built turn by turn.

    ``gen`` marks model-written tokens (the loss mask), ``info`` environment-written ones,
    ``kind`` the action spans (1 search, 2 answer); ``spans`` holds (start, end, kind, turn).
    """

    def __init__(self, prompt_ids):
        self.ids = list(prompt_ids)
        self.prompt_len = len(self.ids)
        self.gen, self.info, self.kind = ([0] * len(self.ids), [0] * len(self.ids),
                                          [0] * len(self.ids))
        self.spans = []

    def add_turn(self, turn_ids, kind, turn_index, offset=None):
        """Append generated tokens; a valid action's span runs from token ``offset`` of the turn
        (the first token overlapping its opening tag, see action_start) to the turn's end."""
        start = len(self.ids)
        self.ids += turn_ids
        self.gen += [1] * len(turn_ids)
        self.info += [0] * len(turn_ids)
        if kind in KIND_IDS:
            self.kind += [0] * offset + [KIND_IDS[kind]] * (len(turn_ids) - offset)
            self.spans.append((start + offset, len(self.ids), kind, turn_index))
        else:
            self.kind += [0] * len(turn_ids)
            self.spans.append((start, len(self.ids), "invalid", turn_index))

    def add_observation(self, obs_ids):
        self.ids += obs_ids
        self.gen += [0] * len(obs_ids)
        self.info += [1] * len(obs_ids)
        self.kind += [0] * len(obs_ids)


def action_start(tokenizer, turn_ids, text, kind):
    """Where the action span of a valid turn starts: the first token whose text overlaps its
    opening tag (a valid turn has exactly one, see search_env.parse_action). None otherwise."""
    if kind not in KIND_IDS:
        return None
    return token_at(tokenizer, turn_ids, text.rindex(SEARCH if kind == "search" else ANSWER))


def tag_length(tokenizer, span_ids, kind):
    """How many leading tokens of an action span complete its opening tag, the decision to
    search or to answer: one for the embedded tokenizer, often several for a pretrained one,
    counted in the decoded span as the rollout finds spans (a token may also hold text after
    the tag)."""
    tag = SEARCH if kind == "search" else ANSWER
    return token_at(tokenizer, span_ids, tokenizer.decode(span_ids).index(tag) + len(tag) - 1) + 1


def encode_episode(tokenizer, prompt, turns, observations):
    """A Transcript of a finished episode given as text (expert demonstrations, tests)."""
    tr = Transcript(tokenizer.encode(prompt, add_special_tokens=False))
    for i, (turn, obs) in enumerate(zip(turns, observations)):
        kind = parse_action(turn).kind
        ids = tokenizer.encode(turn, add_special_tokens=False)
        tr.add_turn(ids, kind, i, action_start(tokenizer, ids, tokenizer.decode(ids), kind))
        if obs:
            tr.add_observation(tokenizer.encode(obs, add_special_tokens=False))
    return tr


def collate(transcripts, pad_id):
    """Right-pad transcripts into a dict of [N, T] tensors (plus prompt_len [N] and spans)."""
    T = max(len(t.ids) for t in transcripts)

    def pad(rows, value):
        return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=torch.long)

    return dict(
        input_ids=pad([t.ids for t in transcripts], pad_id),
        attention_mask=pad([[1] * len(t.ids) for t in transcripts], 0),
        gen_mask=pad([t.gen for t in transcripts], 0),
        info_mask=pad([t.info for t in transcripts], 0),
        action_kind=pad([t.kind for t in transcripts], 0),
        prompt_len=torch.tensor([t.prompt_len for t in transcripts]),
        spans=[t.spans for t in transcripts])


# ----------------------------------------------------------------------------- rollout
@dataclass
class Rollouts:
    """A batch of finished episodes, episode i = question i // group_size. Tensors are [N, T]
    right-padded unless noted."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    gen_mask: torch.Tensor      # model-written tokens (thinking and actions): the loss mask
    info_mask: torch.Tensor     # environment-written tokens: never trained on
    action_kind: torch.Tensor   # 1 inside <search>...</search>, 2 inside <answer>...</answer>
    prompt_len: torch.Tensor    # [N]
    spans: list                 # per episode: [(start, end, kind, turn)]
    rewards: torch.Tensor       # [N] exact match of the final answer (0 if none)
    answers: list               # [N] predicted answer strings (None if none)
    turns: torch.Tensor         # [N] turns used
    questions: list             # [N] the Question of each episode
    turn_texts: list = None     # [N] each episode's generated turns, as its env read them


@torch.no_grad()
def rollout(policy, tokenizer, envs, max_new_tokens=64, temperature=1.0, greedy=False,
            decode="static"):
    """Play one episode per env (search_env.episodes: each question GROUP_SIZE times in a row),
    one batched turn at a time, for at most the envs' ``max_turns`` turns.

    Each sequence stops at ``</search>``, ``</answer>`` or eos; its turn ends with the token
    that completes the stop string, the text goes to its env, and the observation's ids are
    appended. Sampled ids are kept, never re-encoded, so the log-probs are those of the tokens
    sampled. One KV cache lives across turns, so a turn prefills only what is new: the tokens a
    sequence would have written after its stop, and each observation's left padding, stay in
    the batch as masked holes. That is safe because positions come from the mask's running
    sum, so a sequence sees the positions of its right-padded transcript in training.
    Finished episodes leave the batch and the cache. No old-policy log-probs: with one batch per
    update they come free from the policy's forward in train.rl_step.

    ``decode`` (train.DECODE): "static", our own sampling loop over a pre-allocated KV cache
    (decode_turn); "compiled", the same with its one-token step compiled (CUDA graphs on a GPU);
    "generate", HF ``generate`` once per turn. For a seed the static loop samples the tokens
    generate samples (tests/test_model.py); the compiled step's fused kernels may round apart.
    """
    if decode not in DECODES:
        raise ValueError(f"unknown decode {decode!r}; allowed: {DECODES}")
    device = next(policy.parameters()).device
    pad_id = tokenizer.pad_token_id
    # eos, and any other end-of-text id the model's own generation config lists (Qwen: two)
    model_eos = getattr(getattr(policy, "generation_config", None), "eos_token_id", None)
    eos_ids = {tokenizer.eos_token_id,
               *(model_eos if isinstance(model_eos, list) else [model_eos])} - {None}
    if decode == "generate":
        # Every sampling knob is pinned: generate fills unset ones from the model's own
        # generation_config (an instruct model ships top_k, top_p, repetition_penalty), and the
        # loss needs the tokens drawn from softmax(logits / temperature) alone.
        gen_config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=not greedy,
            temperature=temperature if not greedy else None, top_k=0 if not greedy else None,
            top_p=1.0 if not greedy else None, repetition_penalty=1.0,
            stop_strings=list(STOP_STRINGS), eos_token_id=sorted(eos_ids), pad_token_id=pad_id)
        cache = DynamicCache()
    else:
        check_static_decode(policy)
        stops = stop_tokens(tokenizer, frozenset(eos_ids),
                            policy.get_output_embeddings().weight.shape[0])
        cache = KVCache(len(envs), device, compiled=decode == "compiled")
    questions = [env.question for env in envs]
    transcripts = [Transcript(tokenizer.encode(render_prompt(tokenizer, q),
                                               add_special_tokens=False))
                   for q in questions]
    turn_texts = [[] for _ in envs]
    # [B, L]: row r plays episode rows[r]
    ids, mask = _left_pad([t.ids for t in transcripts], pad_id)
    rows = list(range(len(envs)))
    was_training = policy.training
    policy.eval()
    for turn in range(max(env.max_turns for env in envs)):
        if decode == "generate":
            out = policy.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                  tokenizer=tokenizer, generation_config=gen_config,
                                  **{CACHE_KWARG: cache}).cpu()
            new = out[:, ids.shape[1]:]
            cuts = [cut_turn(tokenizer, new[r].tolist(), eos_ids, pad_id)
                    for r in range(len(rows))]
        else:
            new, cuts = decode_turn(policy, tokenizer, cache, ids, mask, max_new_tokens,
                                    temperature, greedy, stops)
            out = torch.cat([ids, new], dim=1)
        kept = torch.zeros_like(new)          # 1 where a generated token belongs to its transcript
        observations = []
        # one retrieval call per turn
        results = step_all([envs[i] for i in rows], [text for _, text in cuts])
        for r, (i, (tokens, text), result) in enumerate(zip(rows, cuts, results)):
            kept[r, :len(tokens)] = 1
            turn_texts[i].append(text)
            kind = result.action.kind
            transcripts[i].add_turn(tokens, kind, turn, action_start(tokenizer, tokens, text, kind))
            obs = (tokenizer.encode(result.observation, add_special_tokens=False)
                   if result.observation else [])
            transcripts[i].add_observation(obs)
            observations.append(obs)
        going = [r for r, i in enumerate(rows) if not envs[i].done]
        if not going:
            break
        obs_ids, obs_mask = _left_pad([observations[r] for r in going], pad_id)
        ids = torch.cat([out[going], obs_ids], dim=1)
        mask = torch.cat([mask[going], kept[going], obs_mask], dim=1)
        if len(going) < len(rows):
            cache.batch_select_indices(torch.tensor(going, device=device))
        rows = [rows[r] for r in going]
    policy.train(was_training)
    batch = collate(transcripts, pad_id)
    return Rollouts(**batch, rewards=torch.tensor([e.reward for e in envs]),
                    answers=[e.answer for e in envs], turns=torch.tensor([e.turns for e in envs]),
                    questions=questions, turn_texts=turn_texts)


def _left_pad(rows, pad_id):
    """Left-pad lists of ids to one [B, L] tensor and its mask, so every row ends at column L."""
    L = max(1, max(map(len, rows)))
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for r, row in enumerate(rows):
        if row:
            ids[r, L - len(row):] = torch.tensor(row)
            mask[r, L - len(row):] = 1
    return ids, mask


def cut_turn(tokenizer, tokens, eos_ids, pad_id):
    """One generated turn as (token ids, text): everything before the first eos, then cut after
    the token that completes the first ``</search>`` or ``</answer>`` (the stop strings). The
    text is what the env reads: it ends at the stop string, even when the last token also holds
    a character or two after it. A turn that ran to max_new_tokens keeps what was written."""
    eos = next((j for j, t in enumerate(tokens) if t in eos_ids), None)
    if eos is not None:
        tokens = tokens[:eos]
    while tokens and tokens[-1] == pad_id:   # a row that stopped early, padded by generate
        tokens = tokens[:-1]
    text = tokenizer.decode(tokens)
    end = stop_end(text)
    if end is not None:
        tokens, text = tokens[:token_at(tokenizer, tokens, end - 1) + 1], text[:end]
    return tokens, text


def stop_end(text):
    """Where the first stop string in ``text`` ends (the index after it), or None."""
    ends = [text.find(s) + len(s) for s in STOP_STRINGS if s in text]
    return min(ends) if ends else None


# ----------------------------------------------------------------------------- static decode
# rollout's decode paths (train.DECODE): our own loop over a pre-allocated KV cache, the same
# with a compiled one-token step, or HF generate
DECODES = ("static", "compiled", "generate")


class KVCache:
    """Every layer's keys and values in buffers allocated once, ``k[i]``, ``v[i]``
    [B, kv_heads, C, head_dim], grown by whole blocks of slots when a turn needs more; ``mask``
    [B, C] is 1 where a slot holds a token its row may attend to; ``used`` counts the slots
    written, the same for every row (a turn's holes take slots too, masked)."""

    BLOCK = 256     # slots come in blocks: few distinct shapes for a compiled step

    def __init__(self, batch, device, compiled=False):
        self.k, self.v, self.used, self.compiled = [], [], 0, compiled
        self.mask = torch.zeros(batch, 0, dtype=torch.long, device=device)

    def reserve(self, length):
        """Room for ``length`` slots; what is written stays."""
        extra = -(-(length - self.mask.shape[1]) // self.BLOCK) * self.BLOCK
        if extra > 0:
            def grow(t):                                      # [B, kv_heads, C, hd]: along C
                return torch.nn.functional.pad(t, (0, 0, 0, extra))
            self.k, self.v = [grow(k) for k in self.k], [grow(v) for v in self.v]
            self.mask = torch.nn.functional.pad(self.mask, (0, extra))
            self._mark_static()

    def write(self, layer, k, v, slots):
        """Store a layer's keys and values [B, kv_heads, q, head_dim] at ``slots`` [q]; the
        first write allocates the layer's buffers, in the dtype the keys come in."""
        if layer == len(self.k):
            shape = (*k.shape[:2], self.mask.shape[1], k.shape[3])
            self.k.append(k.new_zeros(shape))
            self.v.append(v.new_zeros(shape))
            self._mark_static()
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]

    def batch_select_indices(self, rows):
        """Keep only ``rows`` (finished episodes leave the batch); DynamicCache's name for it."""
        self.k, self.v = [k[rows] for k in self.k], [v[rows] for v in self.v]
        self.mask = self.mask[rows]
        self._mark_static()

    def _mark_static(self):
        # A CUDA graph replays fixed addresses: the compiler must know these buffers stay put
        # (and are written in place) between steps.
        if self.compiled:
            for t in self.k + self.v:
                torch._dynamo.mark_static_address(t)


def check_static_decode(policy):
    """The static decode runs the decoder layers of a Llama/Qwen2-shaped model itself; any other
    model (or a sliding-window or q/k-normed attention) is refused in one line."""
    decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    layers = getattr(decoder, "layers", [])
    fits = decoder is not None and hasattr(decoder, "rotary_emb") and all(
        all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "mlp"))
        and all(hasattr(layer.self_attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj"))
        and not getattr(layer.self_attn, "sliding_window", None)
        and not hasattr(layer.self_attn, "q_norm") for layer in layers)
    if not (fits and layers):
        raise ValueError(f"DECODE='static' and 'compiled' run Llama/Qwen2-shaped decoders; this "
                         f"policy is a {type(policy).__name__}: use DECODE='generate'")


def cached_forward(policy, cache, ids, positions, slots, upto):
    """Float32 logits [B, V] after the last of ``ids`` [B, q], the tokens at ``positions``
    [B, q]: their keys and values go to cache slots ``slots`` [q], and each attends to the first
    ``upto`` slots where the cache's mask allows, up to its own slot. HF's own modules do all but
    the attention over the cache: a Llama/Qwen2 layer is RMSNorm, attention with RoPE, RMSNorm,
    MLP, each with a residual; only the last position goes through the final norm and head."""
    decoder = policy.get_decoder()
    B, q = ids.shape
    x = decoder.embed_tokens(ids)                                           # [B, q, d]
    cos, sin = (t[:, None] for t in decoder.rotary_emb(x, positions))       # [B, 1, q, hd]
    visible = (cache.mask[:, None, None, :upto].bool()
               & (torch.arange(upto, device=ids.device) <= slots[:, None]))  # [B, 1, q, upto]
    # as an additive bias: SDPA turns a boolean mask into this anyway, and on the CPU a bias that
    # broadcasts over the heads is the fastest way in (half the time of the boolean mask)
    bias = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(
        ~visible, float("-inf"))
    for i, layer in enumerate(decoder.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        qh, kh, vh = (proj(h).view(B, q, -1, attn.head_dim).transpose(1, 2)
                      for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # [B, heads, q, hd]
        qh, kh = qh * cos + rotate_half(qh) * sin, kh * cos + rotate_half(kh) * sin
        k, v = cache.write(i, kh, vh, slots)
        groups = qh.shape[1] // k.shape[1]
        # Grouped-query attention without copying the cache per query head: the `groups` query
        # heads that share a key/value head become that head's queries, [B, kv_heads, g * q, hd].
        out = torch.nn.functional.scaled_dot_product_attention(
            qh.reshape(B, k.shape[1], groups * q, -1), k[:, :, :upto], v[:, :, :upto],
            attn_mask=bias if q == 1 else bias.repeat(1, 1, groups, 1), scale=attn.scaling)
        x = x + attn.o_proj(out.view(B, -1, q, out.shape[-1]).transpose(1, 2).reshape(B, q, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return policy.get_output_embeddings()(decoder.norm(x[:, -1])).float()


def rotate_half(x):
    """RoPE's rotation: (x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@functools.cache
def compiled_forward():
    """cached_forward compiled once per process; on CUDA ``reduce-overhead`` replays each step
    as one CUDA graph (one per batch size and cache length), no per-kernel launch from Python."""
    return torch.compile(cached_forward, mode="reduce-overhead", dynamic=True)


@dataclass(frozen=True)
class StopTokens:
    """What ends a turn, on token ids. ``eos`` [V]: the end-of-text ids. ``may_stop`` [V]: the
    ids whose text holds the last character of a stop string (">"): only after one of those can a
    stop string be complete, so only then is the turn's tail decoded (``stops``)."""
    eos: torch.Tensor
    may_stop: torch.Tensor
    window: int             # a stop string spans at most this many tokens (one char or more each)

    def stops(self, tokenizer, turn):
        """Whether the turn so far (ids) holds a stop string; a turn stops at the first, so
        only its last ``window`` tokens can hold a new one."""
        return stop_end(tokenizer.decode(turn[-self.window:])) is not None


@functools.lru_cache(maxsize=8)
def stop_tokens(tokenizer, eos_ids, vocab_size):
    """StopTokens of a tokenizer, for a model of ``vocab_size`` outputs (ids past the
    tokenizer's, a padded embedding's, end nothing)."""
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    last_chars = {s[-1] for s in STOP_STRINGS}
    may_stop = torch.zeros(vocab_size, dtype=torch.bool)
    may_stop[:len(texts)] = torch.tensor([any(c in t for c in last_chars) for t in texts])
    eos = torch.zeros(vocab_size, dtype=torch.bool)
    eos[sorted(eos_ids)] = True
    return StopTokens(eos, may_stop, max(map(len, STOP_STRINGS)))


def sample(logits, temperature, greedy):
    """Next ids [B] from float32 logits [B, V], drawn as HF generate draws them (the same random
    numbers for a seed): the argmax, or one draw from softmax(logits / temperature)."""
    if greedy:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(1)


def decode_turn(policy, tokenizer, cache, ids, mask, max_new_tokens, temperature, greedy, stops):
    """One turn of every row, sampled token by token over the KV cache: ``ids``, ``mask``
    [B, T] are the transcripts so far, masked holes and all, of which the cache holds the first
    ``cache.used``; the rest is prefilled in one forward. A row ends at eos (not kept) or
    at the token that completes a stop string (kept); the loop ends when every row has, or after
    ``max_new_tokens``. Returns (new [B, n], pad after each row's end as generate pads, and per
    row (token ids, text) as cut_turn gives them)."""
    device, (B, T) = cache.mask.device, ids.shape
    step = compiled_forward() if cache.compiled else cached_forward
    cache.reserve(T + max_new_tokens)
    cache.mask[:, :T] = mask
    # positions of the right-padded transcript: the mask's running sum
    positions = (mask.cumsum(-1) - 1).clamp(min=0).to(device)               # [B, T]
    fresh = torch.arange(cache.used, T, device=device)
    logits = cached_forward(policy, cache, ids[:, cache.used:].to(device), positions[:, fresh],
                            fresh, T)
    cache.used = T
    new = torch.full((B, max_new_tokens), tokenizer.pad_token_id)           # on the host
    ends = [None] * B                # per row: how many of its new tokens are kept, once ended
    for t in range(max_new_tokens):
        token = sample(logits, temperature, greedy)                          # [B]
        new[:, t] = token.cpu()
        for r in (stops.may_stop[new[:, t]] | stops.eos[new[:, t]]).nonzero()[:, 0].tolist():
            if ends[r] is None and stops.eos[new[r, t]]:
                ends[r] = t
            elif ends[r] is None and stops.stops(tokenizer, new[r, :t + 1].tolist()):
                ends[r] = t + 1
        for r, end in enumerate(ends):
            if end is not None and end <= t:
                new[r, t] = tokenizer.pad_token_id                           # as generate pads
        if None not in ends or t == max_new_tokens - 1:
            break
        cache.mask[:, cache.used] = 1
        slot = torch.tensor([cache.used], device=device)
        logits = step(policy, cache, token[:, None], positions[:, -1:] + 1 + t, slot,
                      cache.mask.shape[1] if cache.compiled else cache.used + 1)
        cache.used += 1
    new = new[:, :t + 1]
    cuts = []
    for r in range(B):
        tokens = new[r, :ends[r] if ends[r] is not None else t + 1].tolist()
        text = tokenizer.decode(tokens)
        cuts.append((tokens, text[:stop_end(text)]))
    return new, cuts


# ----------------------------------------------------------------------------- log-probs
def token_logprobs(model, input_ids, attention_mask, score_mask=None, chunk=4096, temperature=1.0):
    """log p(token_t | tokens_<t) for every position, shape [N, T]; position 0 gets 0.

    Only positions where ``score_mask`` is 1 are computed (all others are 0): the decoder runs
    over the whole batch once, but the output projection and the log-softmax run only on the
    selected hidden states, ``chunk`` rows at a time (fewer for a large vocabulary: 883 for
    Qwen's 152k), with gather - logsumexp instead of a full [N, T, V] log-softmax, so a
    150k-vocabulary model fits in memory. With gradient checkpointing on (enable_checkpointing),
    each chunk's logits are recomputed in the backward pass too: autograd would otherwise keep
    every chunk's [chunk, V] float32 logits, 0.6 MB per scored token of a 150k vocabulary.
    """
    decoder = model.get_decoder()
    # No KV cache in a scoring forward: it would only hold every layer's keys and values.
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                     use_cache=False).last_hidden_state
    if score_mask is None:
        score_mask = attention_mask
    select = score_mask[:, 1:].bool()                          # [N, T-1] targets to score
    h = hidden[:, :-1][select]                                 # [M, d] the states predicting them
    targets = input_ids[:, 1:][select]                         # [M]
    head = model.get_output_embeddings()
    # at most 2^27 logits (512 MB fp32) at once
    rows = min(chunk, max(1, 2**27 // head.weight.shape[0]))
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
    """Gradient (activation) checkpointing: each decoder layer's activations are recomputed in
    the backward pass instead of kept, the usual trade of ~30% more compute for memory."""
    # the renamed method in transformers 5; the kwargs dict either way
    enable = (getattr(model, "activation_checkpointing_enable", None)
              or model.gradient_checkpointing_enable)
    enable({"use_reentrant": False})
