"""Noisy expert episodes packed like a rollout: the batch a warmed-up policy would write, for the
lab's benchmarks and tests of a random model, which writes no actions for the teacher to score."""
import random

import torch

import model
import rollout
import search_env
import toy_world


def expert_rollouts(cfg, tokenizer, world, questions, seed=0):
    """GROUP_SIZE noisy expert episodes of each question, as a rollout.Rollouts."""
    rng = random.Random(seed)
    asked = [q for q in questions for _ in range(cfg["GROUP_SIZE"])]
    episodes = [toy_world.expert_episode(q, world, noise=0.5, rng=rng, max_turns=cfg["MAX_TURNS"],
                                         top_k=cfg["TOP_K"]) for q in asked]
    transcripts = [rollout.encode_episode(tokenizer, model.render_prompt(tokenizer, q), e.turns,
                                          e.observations) for q, e in zip(asked, episodes)]
    return rollout.Rollouts(**rollout.collate(transcripts, tokenizer.pad_token_id),
                            rewards=torch.tensor([e.reward for e in episodes]),
                            answers=[e.answer for e in episodes],
                            turns=torch.tensor([len(e.turns) for e in episodes]),
                            questions=asked, turn_texts=[e.turns for e in episodes],
                            em=torch.tensor([search_env.exact_match(e.answer, q.answers)
                                             for q, e in zip(asked, episodes)]))
