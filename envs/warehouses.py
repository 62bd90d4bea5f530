"""Warehouses: a small resource-optimisation env in JAX, the multi-agent example
(`--env=warehouses`).

In the spirit of MARO's supply-chain scenarios (Microsoft's Multi-Agent Resource Optimization
platform), kept to a page: W warehouses (the agents, `warehouse_0`...) sell to their own
customers and restock from one factory that makes only `production` units a step, fewer than
their demands add up to at their peaks. Each step, every warehouse orders 0, 2, 4, 6 or 8 units
(5 discrete actions); when the orders exceed the production the factory splits it in
proportion to them (the shared, limited resource); the units arrive at once, stock above
`capacity` is wasted, and the warehouse sells what its customers ask, as far as its stock goes.
Demand is Poisson with a seasonal mean, each warehouse's season shifted by a third of a period,
so that their peaks come in turn and a warehouse does well to stock up before its own.

Reward of a warehouse per step: `price` per unit sold, less `order_cost` per unit received,
`holding_cost` per unit held after the sales, `stockout_cost` per unit of demand it could not
meet and `waste_cost` per unit over capacity. The team's return is their sum. Episodes last
`max_steps` steps and end only there (a time limit: truncated, not terminated).

Each agent observes its stock and last demand (scaled by capacity), the share of its last
order the factory filled, the season's phase (sin, cos of its own, and of the time) and the
other warehouses' mean stock; the global state (for MAPPO's critic) is every warehouse's stock
and last demand and the time's phase.

The env has JaxMARL's `MultiAgentEnv` API (`reset`, `step_env`, `agents`, spaces as
Gymnasium's Box and Discrete), plus `global_state` and `time_limit_only`, so
`jax_multi_agent.MultiAgentJaxEnv` adapts it like JaxMARL's own; a multi-agent problem of your
own needs the same few methods (docs/multi_agent.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from trellis.envs.jax_multi_agent import EnvState, MultiAgentJaxEnv
from trellis.envs.multi_agent import MultiAgentStep

# A policy on a batch of observations (launch/loaded_policy.py's `Act`, as `trellis.load` gives).
GreedyAct = Callable[[Any, jax.Array, Mapping[str, jax.Array], Any, jax.Array],
                     tuple[Mapping[str, jax.Array], Any]]

ORDER_SIZES = (0.0, 2.0, 4.0, 6.0, 8.0)  # Units ordered by each of the 5 actions.
OBS_SIZE = 8


@flax.struct.dataclass
class State:
    stock: jax.Array  # [W] units after the last step's sales
    demand: jax.Array  # [W] the last step's demand
    filled: jax.Array  # [W] share of the last order the factory filled
    step: jax.Array  # steps taken this episode


@dataclasses.dataclass(frozen=True)
class Warehouses:
    """The env's settings (see the module docstring for what they mean)."""

    num_warehouses: int = 3
    capacity: float = 20.0
    production: float = 9.0
    mean_demand: float = 3.0
    seasonality: float = 0.8  # Demand's mean swings by this fraction over a season.
    period: int = 24  # Steps per season.
    max_steps: int = 48
    price: float = 1.0
    order_cost: float = 0.3
    holding_cost: float = 0.02
    stockout_cost: float = 0.5
    waste_cost: float = 0.3

    time_limit_only = True  # Episodes end at max_steps only.

    @property
    def agents(self) -> list[str]:
        return [f"warehouse_{i}" for i in range(self.num_warehouses)]

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        del agent
        return gymnasium.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete[np.int64]:
        del agent
        return gymnasium.spaces.Discrete(len(ORDER_SIZES))

    def demand_mean(self, step: jax.Array) -> jax.Array:
        """[W] mean demand of each warehouse at `step` (its season shifted by i / W)."""
        phase = self._phases(step)
        return self.mean_demand * (1.0 + self.seasonality * jnp.sin(phase))

    def _phases(self, step: jax.Array) -> jax.Array:
        shift = jnp.arange(self.num_warehouses) / self.num_warehouses
        return 2 * math.pi * (step / self.period + shift)

    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], State]:
        stock = jax.random.uniform(key, (self.num_warehouses,), minval=0.0,
                                   maxval=self.capacity / 2)
        state = State(stock, jnp.full((self.num_warehouses,), self.mean_demand),
                      jnp.ones((self.num_warehouses,)), jnp.zeros((), jnp.int32))
        return self.get_obs(state), state

    def allocate(self, orders: jax.Array) -> jax.Array:
        """[W] units each warehouse receives: its order, or a share of the production in
        proportion to the orders when they exceed it."""
        total = jnp.sum(orders)
        return orders * jnp.minimum(1.0, self.production / jnp.maximum(total, 1e-6))

    def step_env(self, key: jax.Array, state: State, actions: dict[str, jax.Array]
                 ) -> tuple[dict[str, jax.Array], State, dict[str, jax.Array],
                            dict[str, jax.Array], dict[str, jax.Array]]:
        orders = jnp.asarray(ORDER_SIZES)[jnp.stack([actions[a] for a in self.agents])]
        received = self.allocate(orders)
        stock = state.stock + received
        waste = jnp.maximum(stock - self.capacity, 0.0)
        stock = stock - waste
        demand = jax.random.poisson(key, self.demand_mean(state.step)).astype(jnp.float32)
        sold = jnp.minimum(stock, demand)
        stock = stock - sold
        reward = (self.price * sold - self.order_cost * received - self.holding_cost * stock
                  - self.stockout_cost * (demand - sold) - self.waste_cost * waste)
        filled = jnp.where(orders > 0, received / jnp.maximum(orders, 1e-6), 1.0)
        state = State(stock, demand, filled, state.step + 1)
        done = state.step >= self.max_steps
        dones = {a: done for a in self.agents} | {"__all__": done}
        rewards = {a: reward[i] for i, a in enumerate(self.agents)}
        info = {"sold": sold, "received": received, "demand": demand, "stock": stock}
        return self.get_obs(state), state, rewards, dones, info

    def get_obs(self, state: State) -> dict[str, jax.Array]:
        phases = self._phases(state.step)
        time_phase = 2 * math.pi * state.step / self.period
        stock = state.stock / self.capacity
        others = (jnp.sum(stock) - stock) / max(1, self.num_warehouses - 1)
        obs = jnp.stack([
            stock, state.demand / self.capacity, state.filled, jnp.sin(phases), jnp.cos(phases),
            jnp.full_like(stock, jnp.sin(time_phase)), jnp.full_like(stock, jnp.cos(time_phase)),
            others], axis=1)  # [W, OBS_SIZE]
        return {a: obs[i] for i, a in enumerate(self.agents)}

    def global_state(self, state: State) -> jax.Array:
        time_phase = 2 * math.pi * state.step / self.period
        return jnp.concatenate([state.stock / self.capacity, state.demand / self.capacity,
                                jnp.stack([jnp.sin(time_phase), jnp.cos(time_phase)])])


def make(**kwargs: Any) -> Warehouses:
    """The env with `kwargs` overriding its settings (`JaxMARLFactory.kwargs`)."""
    return Warehouses(**kwargs)


def record_episode(env: MultiAgentJaxEnv, act: GreedyAct, params: Any,
                   key: jax.Array) -> dict[str, np.ndarray]:
    """One episode of a trained policy in `env`, for plots: {"stock", "order", "received",
    "demand", "reward"}, each [max_steps, W] (host arrays).

    Args:
      env: a `jax_multi_agent.MultiAgentJaxEnv` of `Warehouses` (`JaxMARLFactory.make()`).
      act: the policy on a batch of observations, `act(params, key, {agent: obs [N, ...]},
        state, first [N]) -> ({agent: actions [N]}, state)`: a loaded run's
        (`trellis.load(run_dir).greedy`).
      params: the policy's params (`trellis.load(run_dir).params`).
      key: for the env and the policy.
    """
    warehouses: Warehouses = env.env
    agents = warehouses.agents

    def body(carry: tuple[EnvState, MultiAgentStep], key: jax.Array
             ) -> tuple[tuple[EnvState, MultiAgentStep], dict[str, jax.Array]]:
        state, step = carry
        act_key, env_key = jax.random.split(key)
        actions, _ = act(params, act_key, {a: step.obs[a][None] for a in agents}, {},
                         step.first[None])
        actions = {a: actions[a][0] for a in agents}
        orders = jnp.asarray(ORDER_SIZES)[jnp.stack([actions[a] for a in agents])]
        state, step = env.step(env_key, state, actions)
        return (state, step), {
            "stock": state.inner.stock, "order": orders, "received": warehouses.allocate(orders),
            "demand": state.inner.demand, "reward": jnp.stack([step.reward[a] for a in agents])}

    reset_key, key = jax.random.split(key)
    _, record = jax.lax.scan(body, env.reset(reset_key),
                             jax.random.split(key, warehouses.max_steps))
    return {name: np.asarray(v) for name, v in record.items()}
