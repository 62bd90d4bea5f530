"""Configuration: validation helpers for config dataclasses, and the experiment settings."""

from __future__ import annotations

import dataclasses

from trellis.reverb_tables import BACKENDS as REPLAY_BACKENDS


def require(condition: bool, message: str) -> None:
    """Config validation: raises ValueError(message) unless `condition` holds."""
    if not condition:
        raise ValueError(message)


UNROLL_QUEUES = ("local", "replay")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Agent-independent settings of one run."""

    # Acting.
    num_actors: int = 2
    envs_per_actor: int = 32
    # Times each env worker is restarted (fresh process, fresh seed) after it dies or its env
    # raises, before its failure stops the run.
    max_actor_restarts: int = 3
    # Stopping: whichever comes first.
    total_env_steps: int = 1_000_000
    stop_at_return: float | None = None
    return_window: int = 100  # Episodes in the "mean return" used for stopping and reports.
    # Inference batching: wait at most this long for more workers to join a batch.
    inference_timeout_ms: float = 2.0
    seed: int = 0
    log_every_s: float = 1.0
    # False: act and drain unrolls without learning (to measure acting throughput alone).
    learn: bool = True
    # Where full unrolls wait for the learner: "local" (an in-process queue; inference is
    # colocated with the learner) or "replay" (a Queue table on a replay node, the path for
    # a learner that does not share a process with inference), served by `replay_backend`.
    unroll_queue: str = "local"
    replay_backend: str = "native"
    # Checkpoints of the learner state and counters (where: `builders.checkpointing.Checkpoints`).
    checkpoint_every_s: float = 60.0
    keep_checkpoints: int = 3
    # Evaluation of the greedy policy on separate envs: `eval_episodes` episodes at the start
    # and every `eval_every` env steps; 0 turns the evaluator node off.
    eval_every: int = 0
    eval_episodes: int = 10

    def __post_init__(self):
        name = "ExperimentConfig"
        require(self.num_actors >= 1, f"{name}: num_actors must be >= 1, got {self.num_actors}")
        require(self.max_actor_restarts >= 0,
                f"{name}: max_actor_restarts must be >= 0, got {self.max_actor_restarts}")
        require(self.envs_per_actor >= 1,
                f"{name}: envs_per_actor must be >= 1, got {self.envs_per_actor}")
        require(self.total_env_steps >= 1,
                f"{name}: total_env_steps must be >= 1, got {self.total_env_steps}")
        require(self.return_window >= 1,
                f"{name}: return_window must be >= 1, got {self.return_window}")
        require(self.inference_timeout_ms >= 0,
                f"{name}: inference_timeout_ms must be >= 0, got {self.inference_timeout_ms}")
        require(self.log_every_s > 0, f"{name}: log_every_s must be > 0, got {self.log_every_s}")
        require(self.unroll_queue in UNROLL_QUEUES,
                f"{name}: unroll_queue must be one of {UNROLL_QUEUES}, got {self.unroll_queue!r}")
        require(self.replay_backend in REPLAY_BACKENDS,
                f"{name}: replay_backend must be one of {REPLAY_BACKENDS}, "
                f"got {self.replay_backend!r}")
        require(self.checkpoint_every_s > 0,
                f"{name}: checkpoint_every_s must be > 0, got {self.checkpoint_every_s}")
        require(self.keep_checkpoints >= 1,
                f"{name}: keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        require(self.eval_every >= 0, f"{name}: eval_every must be >= 0, got {self.eval_every}")
        require(self.eval_episodes >= 1,
                f"{name}: eval_episodes must be >= 1, got {self.eval_episodes}")

    @property
    def num_envs(self) -> int:
        return self.num_actors * self.envs_per_actor
