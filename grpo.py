"""GRPO (Shao et al., 2024, DeepSeekMath): each answer's reward z-scored in its question's group
is every token's advantage, no value model; then the clipped per-token policy loss. Pure functions
of tensors, to read beside the papers and test alone."""
import torch


def group_advantages(rewards, group_size, eps=1e-4):
    """(r - group mean) / (group std + eps) [N], over contiguous groups of ``group_size`` of
    rewards [N]. The std is unbiased, as in TRL's GRPOTrainer; a group whose rewards are all
    equal gets zeros: it says nothing about which sample was better."""
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)                       # [questions, group]
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)
    return adv.view(-1)                                            # [N]


def policy_loss(logp, old_logp, ref_logp, token_adv, mask, clip_eps=0.2, kl_coef=0.0):
    """PPO clipped surrogate with per-token advantages, plus k3 KL to a frozen reference.

    logp       [N, T] log-probs under the current policy (with gradient)
    old_logp   [N, T] log-probs under the policy that sampled the batch (detached)
    ref_logp   [N, T] log-probs under the frozen reference, or None when kl_coef == 0
    token_adv  [N, T] advantages: GRPO broadcasts A[i]; EviSD modulates it per token
    mask       [N, T] 1 on the tokens to train (the model-written tokens)

    Token losses are summed over the batch and divided by its masked tokens (TRL's "dapo"), so
    every generated token weighs the same, in a long episode or a short one. Returns (loss,
    stats: clip fraction, mean KL, mean ratio over masked tokens)."""
    mask = mask.float()
    n_tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logp - old_logp)                                    # [N, T]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * token_adv, clipped * token_adv)    # [N, T]
    mean_kl = torch.zeros(())
    if kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1.0                                       # k3, >= 0
        per_token = per_token + kl_coef * kl
        mean_kl = (kl * mask).sum() / n_tokens
    loss = (per_token * mask).sum() / n_tokens
    # A token is clipped when the clipped branch is the one the min picks with zero gradient.
    is_clipped = (((ratio < 1 - clip_eps) & (token_adv < 0))
                  | ((ratio > 1 + clip_eps) & (token_adv > 0)))
    stats = {"clip_frac": ((is_clipped.float() * mask).sum() / n_tokens).item(),
             "kl": mean_kl.item(),
             "ratio": ((ratio.detach() * mask).sum() / n_tokens).item()}
    return loss, stats

