"""The fast decode, opt-in: ``train.py --DECODE=static`` (or ``compiled``) plays the rollouts
with ``decoder(DECODE)`` instead of the core's rollout.rollout (HF generate per turn).

Its own turn loop keeps one KV cache for the whole rollout, allocated once and grown by blocks:
each turn prefills only what is new (the observation, and the slots a row would have written
after its stop, kept as masked holes), then samples token by token. A turn ends at eos or at
the token completing a stop string, found on token ids (only a token holding ">" can complete
one, so only then is the tail decoded). ``cached_forward`` runs a Llama/Qwen2-shaped decoder's
own modules and writes the attention over the cache itself; "compiled" compiles that one-token
step (CUDA graphs on a GPU). Everything else is the core's: the transcripts and their action
ranges, the turn's cut, the envs, the Rollouts. For a seed it samples the tokens the core's
rollout samples (lab/tests/test_fast_decode.py); docs/performance.md has its speed.
"""
import functools
from dataclasses import dataclass

import torch

import rollout
from model import render_prompt
from search_env import STOP_STRINGS, stop_end

NAMES = ("static", "compiled")   # train.DECODE's values that this file plays


def decoder(name):
    """The rollout function of decode ``name`` ("static" or "compiled"): called as
    rollout.rollout is, ``play(policy, tokenizer, envs, max_new_tokens=64, temperature=1.0,
    greedy=False) -> rollout.Rollouts``."""
    if name not in NAMES:
        raise ValueError(f"unknown decode {name!r}; lab/fast_decode.py plays {NAMES} "
                         "('generate' is the core's rollout.rollout)")

    def play(policy, tokenizer, envs, max_new_tokens=64, temperature=1.0, greedy=False):
        return play_cached(policy, tokenizer, envs, max_new_tokens, temperature, greedy,
                           compiled=name == "compiled")
    play.__doc__ = f"rollout.rollout's episodes, played by the {name} decode (lab/fast_decode.py)."
    return play


@torch.no_grad()
def play_cached(policy, tokenizer, envs, max_new_tokens, temperature, greedy, compiled):
    """rollout.rollout's episodes over one KV cache: row r of the batch plays episode rows[r];
    ``ids``, ``mask`` [B, L] hold every row's transcript so far, left-padded at the prompt, with
    the holes each turn left (a row's slots after its stop, an observation's left padding)
    masked. Positions come from the mask's running sum, so a row sees the positions of its
    right-padded transcript in training. Finished episodes leave the batch and the cache."""
    check_static_decode(policy)
    device, pad_id = next(policy.parameters()).device, tokenizer.pad_token_id
    eos = rollout.eos_ids(policy, tokenizer)
    stops = stop_tokens(tokenizer, frozenset(eos), policy.get_output_embeddings().weight.shape[0])
    questions = [env.question for env in envs]
    transcripts = [rollout.Transcript(tokenizer.encode(render_prompt(tokenizer, q),
                                                       add_special_tokens=False))
                   for q in questions]
    turn_texts = [[] for _ in envs]
    rows = [i for i, env in enumerate(envs) if not env.done]
    ids = rollout.pad([transcripts[i].ids for i in rows], pad_id, left=True)          # [B, L]
    mask = rollout.pad([[1] * len(transcripts[i].ids) for i in rows], 0, left=True)   # [B, L]
    cache = KVCache(len(rows), device, compiled=compiled)
    was_training = policy.training
    policy.eval()
    for turn in range(max(env.max_turns for env in envs)):
        if not rows:
            break
        new = decode_turn(policy, tokenizer, cache, ids, mask, max_new_tokens, temperature,
                          greedy, stops)                                     # [B, n]
        kept = torch.zeros_like(new)          # 1 where a generated token belongs to its transcript
        observations = []
        for r, i in enumerate(rows):
            tokens, text = rollout.cut_turn(tokenizer, new[r].tolist(), eos, pad_id)
            kept[r, :len(tokens)] = 1
            result = envs[i].step(text)
            turn_texts[i].append(text)
            observations.append(rollout.record_turn(tokenizer, transcripts[i], turn, tokens, text,
                                                    result.action, result.observation))
        going = [r for r, i in enumerate(rows) if not envs[i].done]
        if going:
            obs_ids = rollout.pad([observations[r] for r in going], pad_id, left=True)
            obs_mask = rollout.pad([[1] * len(observations[r]) for r in going], 0, left=True)
            ids = torch.cat([ids[going], new[going], obs_ids], dim=1)
            mask = torch.cat([mask[going], kept[going], obs_mask], dim=1)
            if len(going) < len(rows):
                cache.batch_select_indices(torch.tensor(going, device=device))
        rows = [rows[r] for r in going]
    policy.train(was_training)
    return rollout.Rollouts(
        **rollout.collate(transcripts, pad_id), rewards=torch.tensor([e.reward for e in envs]),
        answers=[e.answer for e in envs], turns=torch.tensor([e.turns for e in envs]),
        questions=questions, turn_texts=turn_texts, em=torch.tensor([e.em for e in envs]))


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
    slot_ids = torch.arange(upto, device=ids.device)
    # Each query sees its row's unmasked slots up to its own, and always its own slot: a padding
    # query (a left-padded prompt's first slots) then attends to something, where some CUDA
    # kernels give NaN for a row with nothing to attend to, and a NaN value poisons every query,
    # even one that gives it weight 0. No real query sees a padding slot, so nothing else moves.
    visible = ((cache.mask[:, None, None, :upto].bool() & (slot_ids <= slots[:, None]))
               | (slot_ids == slots[:, None]))                             # [B, 1, q, upto]
    # as an additive bias: SDPA turns a boolean mask into this anyway, and on the CPU a bias that
    # broadcasts over the heads is the fastest way in (half the time of the boolean mask)
    bias = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(
        ~visible, float("-inf"))
    for i, layer in enumerate(decoder.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        qh, kh, vh = (proj(h).view(B, q, -1, attn.head_dim).transpose(1, 2)
                      for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # [B, heads, q, hd]
        # RoPE in cos/sin's precision (float32), then back to the values' dtype, as autocast
        # would cast them for the attention: the cache holds keys and values alike (bf16 on a GPU)
        qh, kh = ((t * cos + rotate_half(t) * sin).to(vh.dtype) for t in (qh, kh))
        k, v = cache.write(i, kh, vh, slots)
        groups = qh.shape[1] // k.shape[1]
        # Grouped-query attention without copying the cache per query head: the `groups` query
        # heads that share a key/value head become that head's queries, [B, kv_heads, g * q, hd].
        out = torch.nn.functional.scaled_dot_product_attention(
            qh.reshape(B, k.shape[1], groups * q, -1), k[:, :, :upto], v[:, :, :upto],
            attn_mask=bias if q == 1 else bias.repeat(1, 1, groups, 1), scale=attn.scaling)
        # reshape, not view: fused kernels may return the output non-contiguous
        x = x + attn.o_proj(out.reshape(B, -1, q, out.shape[-1]).transpose(1, 2).reshape(B, q, -1))
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
    ``max_new_tokens``. Returns new [B, n], pad after each row's end as generate pads (and in
    place of its eos), for rollout.cut_turn to cut as it cuts generate's turns."""
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
    return new[:, :t + 1]
