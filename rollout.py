"""Rollouts: multi-turn search episodes played in batches, and their transcripts.

``rollout`` plays the episodes one batched turn at a time (HF ``generate``), cuts each turn
after its first ``</search>`` or ``</answer>``, hands its text to the episode's env and appends
the observation. ``Transcript`` records, as each turn is cut, where its action and content lie
(``Span``): nothing later decodes a span again. ``collate`` pads transcripts into ``Rollouts``.
Sampled ids are kept, never re-encoded: the loss scores the very tokens the policy drew."""
import bisect
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import GenerationConfig

from model import render_prompt
from search_env import ANSWER, SEARCH, STOP_STRINGS, parse_action, stop_end

KIND_IDS = {"search": 1, "answer": 2}  # values of action_kind; 0 = not inside an action


# ----------------------------------------------------------------------------- transcripts
class Span(NamedTuple):
    """Where one generated turn lies in its transcript, as token positions (ends exclusive):
    thinking [start, action), opening tag [action, content_start), content [content_start,
    content_end) (the query, the answer), closing tag [content_end, end). An invalid turn has no
    action: action = content_start = content_end = end."""
    turn: int
    kind: str             # "search" | "answer" | "invalid"
    start: int
    action: int
    content_start: int
    content_end: int
    end: int


def token_at(tokenizer, ids, char):
    """The index of the token of ``ids`` covering character ``char`` of ``decode(ids)``, found
    by bisection over decoded prefixes (a byte-level token may hold part of a character)."""
    return bisect.bisect_right(range(len(ids)), char,
                               key=lambda j: len(tokenizer.decode(ids[:j + 1])))


def action_ranges(tokenizer, turn_ids, text, action):
    """(action, content_start, content_end): the token offsets of a turn's parsed action, from the
    characters parse_action found in ``text`` (a token holding part of a tag is the tag's)."""
    if action.kind not in KIND_IDS:
        return None
    opening = SEARCH if action.kind == "search" else ANSWER
    first = token_at(tokenizer, turn_ids, action.opening)
    content_start = token_at(tokenizer, turn_ids, action.opening + len(opening) - 1) + 1
    content_end = max(content_start, token_at(tokenizer, turn_ids, action.closing))
    return first, content_start, content_end


class Transcript:
    """One episode's token ids, built turn by turn, with ``gen`` (model-written tokens: the loss
    mask), ``info`` (environment-written), ``kind`` (1 search, 2 answer) and a Span per turn."""

    def __init__(self, prompt_ids):
        self.ids = list(prompt_ids)
        self.prompt_len = len(self.ids)
        self.gen, self.info, self.kind = ([0] * len(self.ids) for _ in range(3))
        self.spans = []

    def add_turn(self, turn_ids, kind, turn_index, ranges=None, obs_ids=()):
        """Append a generated turn, its action's ``ranges`` and the ids of the env's observation."""
        start, n, m = len(self.ids), len(turn_ids), len(obs_ids)
        action, content_start, content_end = ranges if kind in KIND_IDS else (n, n, n)
        self.ids += [*turn_ids, *obs_ids]
        self.gen += [1] * n + [0] * m
        self.info += [0] * n + [1] * m
        self.kind += [0] * action + [KIND_IDS.get(kind, 0)] * (n - action) + [0] * m
        self.spans.append(Span(turn_index, kind, start, start + action, start + content_start,
                               start + content_end, start + n))


def record_turn(tokenizer, transcript, turn, tokens, text, action, observation):
    """Append a turn (its action's ranges found here, once) and its observation; returns its ids."""
    obs_ids = tokenizer.encode(observation, add_special_tokens=False)
    ranges = action_ranges(tokenizer, tokens, text, action)
    transcript.add_turn(tokens, action.kind, turn, ranges, obs_ids)
    return obs_ids


def encode_episode(tokenizer, prompt, turns, observations):
    """A Transcript of a finished episode given as text (expert demonstrations, tests)."""
    tr = Transcript(tokenizer.encode(prompt, add_special_tokens=False))
    for i, (turn, obs) in enumerate(zip(turns, observations)):
        ids = tokenizer.encode(turn, add_special_tokens=False)
        text = tokenizer.decode(ids)
        record_turn(tokenizer, tr, i, ids, text, parse_action(text), obs or "")
    return tr


def pad(rows, fill, left=False):
    """Lists of ids as one [len(rows), L >= 1] long tensor, right-padded with ``fill`` (or left)."""
    L = max(1, max(map(len, rows), default=0))
    padded = [[fill] * (L - len(r)) + r if left else r + [fill] * (L - len(r)) for r in rows]
    return torch.tensor(padded, dtype=torch.long).view(len(rows), L)


def collate(transcripts, pad_id):
    """Right-pad transcripts into a dict of [N, T] tensors (plus prompt_len [N] and spans)."""
    return dict(input_ids=pad([t.ids for t in transcripts], pad_id),
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
    spans: list                 # per episode: a Span per turn
    rewards: torch.Tensor       # [N] each env's reward (search_env.outcome_reward: exact match)
    answers: list               # [N] predicted answer strings (None if none)
    turns: torch.Tensor         # [N] turns used
    questions: list             # [N] the Question of each episode
    turn_texts: list = None     # [N] each episode's generated turns, as its env read them
    em: torch.Tensor = None     # [N] exact match of the final answer: what evaluation reports


@torch.no_grad()
def rollout(policy, tokenizer, envs, max_new_tokens=64, temperature=1.0, greedy=False):
    """Play one episode per env (search_env.episodes), one batched ``generate`` per turn."""
    device, pad_id = next(policy.parameters()).device, tokenizer.pad_token_id
    eos = eos_ids(policy, tokenizer)
    # Every sampling knob is pinned (model.load_model drops a checkpoint's own): the loss needs
    # the tokens drawn from softmax(logits / temperature) alone, and evaluation the argmax.
    sampling = (dict(do_sample=False) if greedy
                else dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0))
    gen_config = GenerationConfig(max_new_tokens=max_new_tokens, repetition_penalty=1.0,
                                  stop_strings=list(STOP_STRINGS), eos_token_id=sorted(eos),
                                  pad_token_id=pad_id, **sampling)
    transcripts = [Transcript(tokenizer.encode(render_prompt(tokenizer, env.question),
                                               add_special_tokens=False)) for env in envs]
    turn_texts = [[] for _ in envs]
    was_training = policy.training
    policy.eval()
    for turn in range(max(env.max_turns for env in envs)):
        rows = [i for i, env in enumerate(envs) if not env.done]   # the unfinished episodes
        if not rows:
            break
        # left-padded, so that every row's next token comes at the same column
        ids = pad([transcripts[i].ids for i in rows], pad_id, left=True)          # [B, L]
        mask = pad([[1] * len(transcripts[i].ids) for i in rows], 0, left=True)   # [B, L]
        out = policy.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                              tokenizer=tokenizer, generation_config=gen_config).cpu()
        for i, new in zip(rows, out[:, ids.shape[1]:].tolist()):
            tokens, text = cut_turn(tokenizer, new, eos, pad_id)
            result = envs[i].step(text)   # the env parses the action and answers it
            turn_texts[i].append(text)
            record_turn(tokenizer, transcripts[i], turn, tokens, text, result.action,
                        result.observation)
    policy.train(was_training)
    return Rollouts(**collate(transcripts, pad_id), rewards=torch.tensor([e.reward for e in envs]),
                    answers=[e.answer for e in envs], turns=torch.tensor([e.turns for e in envs]),
                    questions=[env.question for env in envs], turn_texts=turn_texts,
                    em=torch.tensor([e.em for e in envs]))


def eos_ids(policy, tokenizer):
    """The ids that end a turn: eos, and any other end-of-text id the model's own generation
    config lists (Qwen's lists two)."""
    listed = getattr(getattr(policy, "generation_config", None), "eos_token_id", None)
    return {tokenizer.eos_token_id, *(listed if isinstance(listed, list) else [listed])} - {None}


def cut_turn(tokenizer, tokens, eos_ids, pad_id):
    """(token ids, text) of a generated turn: what precedes the first eos, cut after the token
    completing the first stop string; the text, what the env reads, ends at the stop string."""
    tokens = tokens[:next((j for j, t in enumerate(tokens) if t in eos_ids), len(tokens))]
    while tokens and tokens[-1] == pad_id:   # a row that stopped early, padded by generate
        tokens = tokens[:-1]
    text = tokenizer.decode(tokens)
    if (end := stop_end(text)) is not None:
        tokens, text = tokens[:token_at(tokenizer, tokens, end - 1) + 1], text[:end]
    return tokens, text
