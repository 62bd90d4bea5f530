"""PPO's and APPO's `--preset=atari` (docs/atari.md).

PPO: cleanrl's `ppo_atari.py` (Huang et al., 2022, "CleanRL: High-quality Single-file
Implementations of Deep Reinforcement Learning Algorithms"; the settings of "The 37
Implementation Details of PPO"): 8 envs x 128 steps per batch, 4 minibatches, 4 epochs.

APPO: Sample Factory's Atari settings (Petrenko et al., 2020; sf_examples/atari/atari_params.py,
`atari_override_defaults`), which were chosen to match cleanrl's: the same batch, clip and
costs, Adam's epsilon 1e-5.

What neither source shares with Trellis (docs/atari.md): the conv torso is PPO's default (the
2013 DQN paper's smaller one, not the Nature DQN's of both sources), Sample Factory normalises
returns, and its Atari run turns V-trace off (`with_vtrace=False`, synchronous): APPO keeps
V-trace, its reason to exist; Sample Factory's run without it is `--agent=ppo`. As in both,
the actor and the critic share one torso (`shared_torso`: cleanrl's network, Sample Factory's
default `actor_critic_share_weights=True`).
"""

from trellis.agents.presets import Preset

# The settings both sources use.
_COMMON = {
    # One learner batch: 8 unrolls of 128 steps (cleanrl's 8 envs x 128 steps), 4 epochs of 4
    # minibatches of 256 transitions.
    "unroll_length": 128,
    "batch_size": 8,
    "num_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 2.5e-4,
    "learning_rate_schedule": "linear",  # Annealed to 0 over the budget in both.
    "adam_eps": 1e-5,
    "clip_epsilon": 0.1,
    "entropy_cost": 0.01,
    "value_cost": 0.5,
    "max_grad_norm": 0.5,
    "discount": 0.99,
    "gae_lambda": 0.95,
    "normalize_advantages": True,
    "shared_torso": True,
    "reward_clip": 1.0,
    # The env (stable-baselines3's Atari wrappers in both): a lost life ends an episode, 4
    # frames skipped (max-pooled) and 4 stacked, 84 x 84 grey, up to 30 no-ops, NoFrameskip-v4
    # games (no sticky actions, the minimal action set).
    "episodic_life": True,
    "frame_skip": 4,
    "frame_stack": 4,
    "frame_size": 84,
    "noop_max": 30,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
}

# cleanrl clips the value change too (clip_vloss, with the policy's clip range).
PPO_ATARI = Preset(source="CleanRL cleanrl/ppo_atari.py (its Args' defaults and Atari wrappers)",
                   settings={**_COMMON, "value_clip_epsilon": 0.1})
APPO_ATARI = Preset(source="Sample Factory sf_examples/atari/atari_params.py "
                           "(atari_override_defaults)",
                    settings=_COMMON)
