"""R2D2 configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import AgentConfig, setting


@dataclasses.dataclass(frozen=True)
class R2D2Config(AgentConfig):
    """Hyper-parameters of R2D2 (Kapturowski et al., 2019); sources and deviations in
    agents/r2d2/README.md.

    A replay item is a sequence of `burn_in + trace_length + 1` steps: the burn-in only
    rebuilds the recurrent state from the one stored at the sequence's start, the trace is
    learned from, and its last step is only bootstrapped from. A new sequence starts every
    `unroll_length` steps of an env slot, so consecutive ones overlap.

    Defaults solve CartPoleNoVel-v1 on a 2-core machine with run.py's 2 x 32 envs.
    """

    unroll_length: int = 10  # The sequence period: new env steps per sequence.
    batch_size: int = 32  # Sequences per SGD step.
    hidden_sizes: tuple[int, ...] = (64,)  # MLP torso before the LSTM (conv for pixels).
    discount: float = 0.99
    learning_rate: float = 1e-3
    max_grad_norm: float = 40.0

    burn_in: int = setting(10, "steps that only rebuild the recurrent state (no gradient)", ge=0)
    trace_length: int = setting(20, "steps of each sequence the loss learns from", ge=1)
    lstm_size: int = setting(64, "units of the LSTM core", ge=1)
    n_step: int = setting(3, "steps of the n-step double-Q targets", ge=1)
    value_rescaling_eps: float = setting(
        1e-3, "epsilon of the value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x", gt=0)
    target_update_period: int = setting(
        100, "SGD steps between copies of the online network to the target", ge=1)

    # Prioritized replay of sequences (a table on the replay node).
    replay_size: int = setting(5_000, "sequences the replay table holds", ge=1)
    min_replay_size: int = setting(
        200, "no sampling before the table holds this many sequences", ge=1)
    samples_per_insert: float = setting(
        4.0, "rate limiter: times each sequence is sampled on average", gt=0)
    error_buffer: float = setting(
        400.0, "rate limiter: samples that sampling may run ahead of or behind "
        "samples_per_insert x inserts", gt=0)
    priority_exponent: float = setting(0.9, "prioritized replay: priority exponent", ge=0)
    importance_exponent: float = setting(
        0.6, "prioritized replay: importance-weight exponent", ge=0)
    priority_eta: float = setting(
        0.9, "sequence priority: eta * max |TD| + (1 - eta) * mean |TD|", ge=0, le=1)

    # Exploration: env slot i of N acts with epsilon ** (1 + epsilon_alpha * i / (N - 1)).
    # The papers' base is 0.4; on CartPole the slots near 0.4 rarely keep the pole up for
    # long, finish the most episodes and held the training mean near 350 (README).
    epsilon: float = setting(0.1, "exploration epsilon (the base of the ladder)", ge=0, le=1)
    epsilon_alpha: float = setting(7.0, "exponent spread of the per-slot epsilon ladder", ge=0)

    def check(self) -> None:
        if self.unroll_length > self.trace_length:
            # A longer period would skip steps: no sequence would learn from them.
            raise self.invalid("unroll_length", f"<= trace_length = {self.trace_length}")
        if self.error_buffer < max(1.0, self.samples_per_insert):
            # Reverb's rule: a narrower band can block inserts and samples at once.
            raise self.invalid("error_buffer", f">= max(1, samples_per_insert) = "
                                               f"{max(1.0, self.samples_per_insert):g}")
        if self.min_replay_size > self.replay_size:
            raise self.invalid("min_replay_size", f"<= replay_size = {self.replay_size}")

    @property
    def sequence_length(self) -> int:
        """Steps per replay item: burn-in, trace, and the trace's bootstrap step."""
        return self.burn_in + self.trace_length + 1

    @property
    def overlap(self) -> int:
        """Steps a sequence repeats from the end of the previous one of its env slot."""
        return self.sequence_length - self.unroll_length
