"""PPO configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import AgentConfig, setting

# The defaults that differ on a platform; run.py applies them (flags, --config and --resume
# still override them). On anakin the whole loop runs in one program and an env step costs
# ~0.2 us, so the update bounds the speed: one epoch of two minibatches on 16 envs and one
# layer of 32 (a hundredth of the default's multiply-adds per env step) still solve
# CartPole-v1 in 120,000-310,000 env steps, sooner in wall time; populations then fill the
# cores that one member leaves idle (docs/anakin.md).
PLATFORM_DEFAULTS = {
    "anakin": {"batch_size": 16, "num_epochs": 1, "num_minibatches": 2, "hidden_sizes": (32,),
               "learning_rate": 5e-3},
}


@dataclasses.dataclass(frozen=True)
class PPOConfig(AgentConfig):
    """Hyper-parameters of PPO (Schulman et al., 2017).

    Defaults solve CartPole-v1 fast on a 2-core machine with run.py's 2 x 32 envs (tuned with
    the sweep in agents/ppo/README.md).
    """

    unroll_length: int = 16
    batch_size: int = 64
    max_queue_size: int = 1  # Bounds how off-policy the data is.
    learning_rate: float = 2.5e-3
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5

    # Optimisation per batch: `num_epochs` passes, each over `num_minibatches` minibatches
    # of the batch's T * B transitions, shuffled.
    num_epochs: int = setting(4, "passes over each batch", ge=1)
    num_minibatches: int = setting(
        4, "minibatches per pass; must divide unroll_length * batch_size", ge=1)

    # Returns and advantages.
    gae_lambda: float = setting(0.95, "GAE's lambda", ge=0, le=1)
    normalize_advantages: bool = setting(True, "normalise advantages per minibatch")

    # Loss.
    clip_epsilon: float = setting(0.2, "clip range of the probability ratio", gt=0)
    value_clip_epsilon: float | None = setting(
        None, "clip range of the value change; none: no value clipping", gt=0)
    value_cost: float = setting(0.5, "weight of the value loss", ge=0)
    entropy_cost: float = setting(0.0, "weight of the entropy bonus", ge=0)

    # Scales (Brax's PPO `normalize_observations` and `reward_scaling`, which its published
    # settings for physics tasks use: agents/ppo/README.md).
    normalize_observations: bool = setting(
        False, "normalise vector observations by running moments (in the params, checkpointed)")
    reward_scale: float = setting(1.0, "the learner multiplies rewards by this", gt=0)

    def check(self) -> None:
        if self.num_transitions % self.num_minibatches:
            raise self.invalid(
                "num_minibatches", f"a divisor of unroll_length * batch_size = "
                f"{self.num_transitions} (the transitions of a batch)")

    @property
    def num_transitions(self) -> int:
        """Transitions per learner batch, T * B."""
        return self.unroll_length * self.batch_size

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch."""
        return self.num_transitions // self.num_minibatches
