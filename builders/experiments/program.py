"""Turns (builder, env factory, experiment config) into a launchable program graph."""

from __future__ import annotations

from trellis.builders.contract.agent import Builder
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import Checkpoints
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.builders.experiments.evaluation import Evaluator
from trellis.builders.experiments.feeds import agent_table, max_unrolls
from trellis.builders.experiments.inference import agent_step_specs
from trellis.builders.experiments.learner_node import LearnerNode
from trellis.builders.experiments.stop import StopRule
from trellis.builders.experiments.unroll_queue import unroll_table_spec
from trellis.envs.contract import EnvFactory
from trellis.launch import runtime
from trellis.reverb_tables import ReplayNode


def make_program(
    builder: Builder,
    env_factory: EnvFactory,
    config: ExperimentConfig,
    name: str = "trellis",
    checkpoints: Checkpoints | None = None,
    stop_rule: StopRule | None = None,
) -> runtime.Program:
    """SEED-style graph: one learner node (inference inside), `num_actors` env workers.

    Env workers are restarted up to `config.max_actor_restarts` times each; the learner is
    never restarted (its failure stops the program).

    A "replay" node holds the builder's own replay table (`Builder.replay_table`, e.g.
    R2D2's prioritized sequences) where it has one, which then feeds the learner; otherwise,
    with `config.unroll_queue == "replay"`, the Queue table through which unrolls reach the
    learner. With `config.eval_every > 0` an "evaluator" node runs
    the greedy policy on envs of its own. With `checkpoints`, the learner checkpoints there
    (and resumes from its `resume_step`); the learner node stops the program by `stop_rule`
    (default: the config's).

    Returns:
      The program; its "learner" group holds one node whose handle is the env workers'
      inference server and answers `stats()`.
    """
    # Env workers' processes fork from a server that imported their module (numpy, Gymnasium).
    program = runtime.Program(name, preload=(EnvWorker.__module__,))
    replay = None
    spec = env_factory.spec()
    table = agent_table(builder, spec)
    if table is None and config.unroll_queue == "replay":
        queue_spec = builder.queue_spec()
        table = unroll_table_spec(agent_step_specs(builder, spec), queue_spec.unroll_length,
                                  config.envs_per_group, max_unrolls(queue_spec, config))
    if table is not None:
        with program.group("replay"):
            replay = program.add_node(
                runtime.CourierNode(ReplayNode, [table], config.replay_backend, config.seed))
    # On a cluster (platform "ray") the learner lands where the accelerator is and env
    # workers on CPU machines; other platforms ignore resources.
    with program.group("learner", resources={"CPU": 1, "accelerator": 1}):
        learner = program.add_node(
            runtime.CourierNode(LearnerNode, builder, env_factory, config, replay, checkpoints,
                                stop_rule))
    # A restarted env worker comes back with a new run id; inference then drops its partial
    # unrolls, so no unroll spans the restart.
    with program.group("actor", max_restarts=config.max_actor_restarts,
                       resources={"CPU": 1}, nice=config.actor_nice):
        for i in range(config.num_actors):
            program.add_node(runtime.CourierNode(
                EnvWorker, env_factory, learner, i, config.envs_per_actor,
                actor_seed(config.seed, i, config.envs_per_actor), config.env_buffers
            ))
    if config.eval_every > 0:
        with program.group("evaluator"):
            program.add_node(runtime.CourierNode(Evaluator, builder, env_factory, learner, config))
    return program


def actor_seed(seed: int, actor: int, envs_per_actor: int) -> int:
    """The seed of env worker `actor`'s envs in a run of root seed `seed`, reproducible per run.

    A vector env seeds its K envs with seed, seed + 1, ..., seed + K - 1 (Gymnasium's sync
    vector env, envpool), so the workers' seeds are K apart and every env of the run gets a
    seed of its own (one apart, neighbouring workers shared all but one of their envs' seeds
    and, given the same actions, stepped the same games). They stay below the evaluator's
    (`evaluation.evaluation_seed`) while the run has fewer than 9,972 envs.
    """
    return seed * 10_007 + 1 + actor * envs_per_actor
