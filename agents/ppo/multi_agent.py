"""IPPO and MAPPO: PPO for each policy of a multi-agent env (`--agent=ippo`, `--agent=mappo`).

IPPO (de Witt et al., 2020, "Is Independent Learning All You Need in the StarCraft
Multi-Agent Challenge?", https://arxiv.org/abs/2011.09533) learns every policy with PPO from
its own agents' observations and rewards; MAPPO (Yu et al., 2022, "The Surprising
Effectiveness of PPO in Cooperative Multi-Agent Games", https://arxiv.org/abs/2103.01955) gives
the critic the env's global state instead (envs/multi_agent.py: the env's own, or the agents'
observations concatenated where it has none, as on JaxMARL's MPE), with the agent's one-hot id
where a policy serves several agents; the actor still sees only the agent's observation.

Agents go to policies by the policy mapping (builders/contract/policy_mapping.py: `shared`,
`per_agent` or `PATTERN=POLICY,...`). Each policy is one PPO learner, unchanged: its networks
(agents/ppo/networks.py), GAE and loss (agents/ppo/losses.py) and update
(agents/ppo/learner.make_update) run on its agents' steps, stacked on the batch axis
([T + 1, B * n] for n agents), with its own params and optimizer state; the training state is
a `MultiPolicyState` of {policy: TrainingState}, so a checkpoint holds one entry per policy and
restores them all.
Nothing of PPO is copied; IPPO and MAPPO live in PPO's folder (as Ape-X lives in DQN's) because
agents share code only through agents/common, and these are PPO per policy.

Masks: a step after which an agent no longer acts (`alive` False: it finished before the
others) is given to PPO as its ignored autoreset steps are: masked out of the loss, no trace
across it. The agent's last transition, into its terminal observation, is learned from.

On anakin, the env is stepped as one env whose observation is the whole `MultiAgentStep` and
whose reward is the team's (the sum over agents: what the return window, the stop rule and
the learning curve count; JaxMARL's MPE logger reports the same sum). Metrics go per policy
(`policy/<id>/<name>`) and per agent (`agent/<id>/reward_mean`, the mean reward per step it
acted).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.agents.common import AgentBuilder, MLPTorso
from trellis.agents.common.multi_agent import (  # noqa: F401 (group_batch: re-exported)
    MultiPolicyState,
    PolicyMappingConfig,
    group_batch,
    per_policy_training,
)
from trellis.agents.common.params import Params, pure_apply
from trellis.agents.ppo.config import PPOConfig
from trellis.agents.ppo.learner import make_training as ppo_training
from trellis.agents.ppo.networks import ActorCritic, PPONetworks, make_networks
from trellis.builders.contract.agent import (
    UNROLLS,
    ArraySpec,
    Capabilities,
    Policy,
    State,
    Training,
)
from trellis.builders.contract.config import setting
from trellis.builders.contract.policy_mapping import (
    PolicyGroup,
    add_agent_ids,
    stack,
    unstack,
)
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep


@dataclasses.dataclass(frozen=True)
class IPPOConfig(PolicyMappingConfig, PPOConfig):
    """IPPO's settings: PPO's, with the defaults of JaxMARL's published IPPO on MPE
    (baselines/IPPO/config/ippo_ff_mpe.yaml: 16 envs x 128 steps, 4 epochs of 4 minibatches,
    lr 2.5e-4, entropy 0.01, two tanh layers of 64; its linear learning-rate decay is not
    done here), and the policy mapping."""

    unroll_length: int = 128
    batch_size: int = 16  # Envs: each update takes T steps of every agent of B envs.
    learning_rate: float = 2.5e-4
    entropy_cost: float = 0.01
    centralised_critic: bool = setting(
        False, "the critic sees the env's global state (MAPPO) instead of the agent's "
        "observation (IPPO)")

    def check(self) -> None:
        super().check()
        if self.centralised_critic and self.normalize_observations:
            raise self.invalid("normalize_observations",
                               "false with the centralised critic (mappo's network has none)")
        if self.centralised_critic and self.shared_torso:
            raise self.invalid("shared_torso", "false with the centralised critic (it reads "
                               "the global state, the actor the agent's own observation)")


@dataclasses.dataclass(frozen=True)
class MAPPOConfig(IPPOConfig):
    """MAPPO's settings: IPPO's with the centralised critic."""

    centralised_critic: bool = True


class _Slice(nn.Module):
    """A torso on a slice of the input's last axis: the actor's and the critic's parts."""

    torso: nn.Module
    start: int
    stop: int | None

    def __call__(self, x: jax.Array) -> jax.Array:
        features: jax.Array = self.torso(x[..., self.start:self.stop])
        return features


@dataclasses.dataclass(frozen=True)
class MultiAgentNetworks:
    """One PPO network per policy, and what each policy's input is made of.

    Attributes:
      groups: the policies and their agents (`PolicyMapping.groups`).
      policies: {policy id: PPONetworks}; their input is `inputs(group, step)`.
      centralised_critic: the input ends with the global state (and the agent id) that only
        the critic sees.
    """

    groups: tuple[PolicyGroup, ...]
    policies: Mapping[str, PPONetworks]
    centralised_critic: bool

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(a for g in self.groups for a in g.agents)

    def inputs(self, group: PolicyGroup, step: MultiAgentStep) -> jax.Array:
        """[N, n, D] of the group's n agents in N envs (`step`'s leaves [N, ...]): each agent's
        observation with its one-hot id (`add_agent_ids`), then, for a centralised critic, the
        global state with the id."""
        x: jax.Array = add_agent_ids(group, stack(group, step.obs, jnp), jnp)
        if not self.centralised_critic:
            return x
        n = len(group.agents)
        state = jnp.broadcast_to(step.global_state[:, None].astype(jnp.float32),
                                 (x.shape[0], n) + step.global_state.shape[1:])
        return jnp.concatenate([x, add_agent_ids(group, state, jnp)], axis=-1)


def make_multi_agent_networks(spec: MultiAgentSpec, config: IPPOConfig) -> MultiAgentNetworks:
    """PPO's networks for each policy of `config.mapping` on `spec`.

    Raises:
      builders.contract.policy_mapping.PolicyMappingError: the mapping does not fit the agents.
      ValueError: a centralised critic on an env without a global state.
    """
    groups = config.mapping.groups(spec)
    if config.centralised_critic and spec.global_state_shape is None:
        raise ValueError("mappo's critic needs the env's global state; this env has none "
                         "(use --agent=ippo)")
    policies: dict[str, PPONetworks] = {}
    for group in groups:
        networks = make_networks(group.spec, config.hidden_sizes, config.normalize_observations,
                                 config.pixel_torso, config.shared_torso)
        if config.centralised_critic:
            actor_size = group.spec.observation_shape[0]
            net = ActorCritic(
                policy_torso=_Slice(MLPTorso(config.hidden_sizes), 0, actor_size),
                value_torso=_Slice(MLPTorso(config.hidden_sizes), actor_size, None),
                num_outputs=group.spec.num_actions or group.spec.action_shape[0],
                gaussian=not group.spec.discrete)
            critic_size = _size(spec.global_state_shape) + (len(group.agents)
                                                            if group.agent_ids else 0)
            dummy = jnp.zeros((1, actor_size + critic_size), jnp.float32)
            networks = PPONetworks(init=functools.partial(_init, net, dummy),
                                   apply=pure_apply(net), distribution=networks.distribution)
        policies[group.policy] = networks
    return MultiAgentNetworks(groups, policies, config.centralised_critic)


def _init(net: nn.Module, dummy: jax.Array, key: jax.Array) -> Params:
    return net.init(key, dummy)


def _size(shape: tuple[int, ...] | None) -> int:
    return int(functools.reduce(lambda a, b: a * b, shape or (), 1))


def make_policy(networks: MultiAgentNetworks, evaluation: bool = False) -> Policy:
    """`policy(params, key, step, state, first) -> (actions, extras, state)` on N envs'
    `MultiAgentStep`: each policy acts for its agents in one batch; actions and extras are
    {agent: [N, ...]}; the distribution's mode when evaluating."""

    def policy(params: Params, key: jax.Array, step: MultiAgentStep, state: State,
               first: jax.Array
               ) -> tuple[dict[str, jax.Array], dict[str, dict[str, jax.Array]], State]:
        del first  # Feed-forward: nothing to reset.
        actions: dict[str, jax.Array] = {}
        extras: dict[str, dict[str, jax.Array]] = {"log_prob": {}, "value": {}}
        keys = jax.random.split(key, len(networks.groups))
        for group, group_key in zip(networks.groups, keys, strict=True):
            net = networks.policies[group.policy]
            x = networks.inputs(group, step)  # [N, n, D]
            rows = x.shape[0] * x.shape[1]
            dist_params, value = net.apply(params[group.policy], x.reshape((rows, -1)))
            distribution = net.distribution
            if evaluation:
                action = learn_action = distribution.mode(dist_params)
            else:
                action, learn_action = distribution.sample(group_key, dist_params)
            out = {"action": action, "log_prob": distribution.log_prob(dist_params, learn_action),
                   "value": value}
            if distribution.learn_field != "action":
                out[distribution.learn_field] = learn_action
            for name, v in out.items():
                per_agent = unstack(group, v.reshape(x.shape[:2] + v.shape[1:]))
                (actions if name == "action" else extras.setdefault(name, {})).update(per_agent)
        return actions, extras, state

    return policy


def make_training(networks: MultiAgentNetworks, config: IPPOConfig) -> Training:
    """A `MultiPolicyState` of PPO's training per policy (its batch: the envs' B times the
    policy's agents), and the update that runs each on its policy's batch."""
    return per_policy_training(networks, {
        group.policy: ppo_training(networks.policies[group.policy], dataclasses.replace(
            config, batch_size=config.batch_size * len(group.agents)))
        for group in networks.groups})


class IPPOBuilder(AgentBuilder[MultiAgentSpec]):
    """Builder of IPPO and MAPPO (`config.centralised_critic`) on multi-agent envs."""

    config: IPPOConfig

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True, multi_agent=True)

    def make_networks(self, spec: MultiAgentSpec) -> MultiAgentNetworks:
        return make_multi_agent_networks(spec, self.config)

    def extras_spec(self, spec: MultiAgentSpec) -> dict[str, ArraySpec]:
        """What acting records per agent beside its action: the behaviour log-probability and
        value ({agent: ...} each in the records)."""
        del spec
        return {"log_prob": ArraySpec((), "float32"), "value": ArraySpec((), "float32")}

    def make_policy(self, networks: MultiAgentNetworks, evaluation: bool = False) -> Policy:
        return make_policy(networks, evaluation)

    def make_training(self, networks: MultiAgentNetworks,
                      spec: MultiAgentSpec) -> Training:
        del spec  # The networks know the groups and shapes.
        return make_training(networks, self.config)
