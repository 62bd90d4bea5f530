"""R2D2 builder: the one place that wires networks, policy, replay table, learner and queue
spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trellis import reverb_tables as rt
from trellis.agents.common import AgentBuilder, lstm_initial_state
from trellis.agents.common.params import Params
from trellis.agents.r2d2.config import R2D2Config
from trellis.agents.r2d2.learner import Learner, make_training
from trellis.agents.r2d2.networks import R2D2Networks, make_networks
from trellis.builders.contract.agent import (
    REPLAY,
    ArraySpec,
    Capabilities,
    Policy,
    QueueSpec,
    State,
    Training,
)
from trellis.envs.specs import EnvSpec

TABLE = "sequences"


def epsilon_ladder(num_slots: int, epsilon: float, alpha: float) -> np.ndarray:
    """eps_i = epsilon ** (1 + alpha * i / (N - 1)) for slots i < N (Horgan et al., 2018;
    R2D2 with epsilon = 0.4, alpha = 7); one slot gets epsilon."""
    i = np.arange(num_slots, dtype=np.float64)
    exponent = 1.0 + alpha * i / max(num_slots - 1, 1)
    return (epsilon ** exponent).astype(np.float32)


class R2D2Builder(AgentBuilder[EnvSpec]):
    """Builder for R2D2; acting is SEED-style through the central inference server, which
    keeps every env slot's LSTM state (and its fixed epsilon) on the device.

    Inference cuts each slot's steps into sequences of `burn_in + trace_length + 1` steps
    that start every `unroll_length` steps, each with the policy state at its first step;
    they go into this builder's prioritized replay table on the replay node, from which the
    learner samples.
    """

    config: R2D2Config

    def queue_spec(self) -> QueueSpec:
        c = self.config
        return QueueSpec(c.sequence_length - 1, c.batch_size, c.max_queue_size,
                         overlap=c.overlap)

    def make_networks(self, spec: EnvSpec) -> R2D2Networks:
        return make_networks(spec, self.config.hidden_sizes, self.config.lstm_size)

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """Zero LSTM state, and slot i's epsilon from the ladder over all slots."""
        del spec
        c = self.config
        return dict(lstm_initial_state(num_slots, c.lstm_size),
                    epsilon=epsilon_ladder(num_slots, c.epsilon, c.epsilon_alpha))

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> rt.TableSpec:
        """Prioritized sequences, the oldest evicted first, sampled `samples_per_insert` times
        each on average (the rate limiter holds inference back when the learner lags)."""
        c = self.config
        limiter = rt.SampleToInsertRatio(c.samples_per_insert, c.min_replay_size,
                                         c.error_buffer)
        return rt.TableSpec(TABLE, rt.Prioritized(c.priority_exponent), rt.Fifo(),
                            c.replay_size, limiter, signature=dict(signature))

    def make_policy(self, networks: R2D2Networks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first[N]) -> (actions[N], {}, state)`:
        greedy when evaluating, otherwise epsilon-greedy with each row's own epsilon (the
        state's `epsilon`, which a reset keeps)."""

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            core, q = networks.apply(params, state, obs[None], first[None])  # q [1, N, A]
            greedy = jnp.argmax(q[0], axis=-1).astype(jnp.int32)
            new_state = dict(core, epsilon=state["epsilon"])
            if evaluation:
                return greedy, {}, new_state
            n = obs.shape[0]
            explore_key, action_key = jax.random.split(key)
            explore = jax.random.uniform(explore_key, (n,)) < state["epsilon"]
            random_actions = jax.random.randint(action_key, (n,), 0, networks.num_actions)
            return jnp.where(explore, random_actions, greedy), {}, new_state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY, recurrent=True)

    def make_training(self, networks: R2D2Networks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)

    def make_learner(self, networks: R2D2Networks, spec: EnvSpec, key: jax.Array, *,
                     devices: Sequence[jax.Device] | None = None,
                     replay: Any = None) -> Learner:
        """Raises ValueError without `replay`, the client of the replay node's table."""
        del spec
        if replay is None:
            raise ValueError(f"R2D2 learns from the replay table {TABLE!r}: make_learner needs "
                             f"replay=<a client of the replay node holding it>")
        return Learner(networks, self.config, key, replay, TABLE, devices=devices)
