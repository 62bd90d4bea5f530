"""Turns (builder, env factory, experiment config) into a launchable program graph.

`make_program` lays out the nodes; `learner_node` builds the learner node's parts in that
node's own process and passes them in (Launchpad's and Acme's way: a node receives its
collaborators, it does not build them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax

from trellis.builders.contract.agent import Builder, QueueSpec, init_device
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import Checkpoints, open_checkpoints
from trellis.builders.experiments.distributed import (
    FollowerParts,
    LearnerFollower,
    process_share,
    start_group,
)
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.builders.experiments.evaluation import Evaluator
from trellis.builders.experiments.feeds import (
    Prefetch,
    ReplayFeed,
    UnrollFeed,
    agent_table,
    batch_sizes,
    max_unrolls,
    unroll_queue,
)
from trellis.builders.experiments.inference import (
    InferenceServer,
    InferenceSettings,
    ServedPolicy,
    agent_step_specs,
)
from trellis.builders.experiments.learner_node import LearnerNode
from trellis.builders.experiments.learner_stats import LearnerStats
from trellis.builders.experiments.learner_update import CompileAhead, LearnerUpdate
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.step_format import step_format
from trellis.builders.experiments.stop import StopRule
from trellis.builders.experiments.unroll_queue import unroll_signature, unroll_table_spec
from trellis.envs.contract import EnvFactory
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec
from trellis.launch import runtime
from trellis.launch.runtime.node_context import StopEvent
from trellis.reverb_tables import ReplayClient, ReplayNode, TableSpec


def make_program(
    builder: Builder[Any],
    env_factory: EnvFactory,
    config: ExperimentConfig,
    name: str = "trellis",
    checkpoints: Checkpoints | None = None,
    stop_rule: StopRule | None = None,
    video_dir: str | None = None,
) -> runtime.Program:
    """SEED-style graph: one learner node (inference inside), `num_actors` env workers.

    Env workers are restarted up to `config.max_actor_restarts` times each, the learner (from
    its newest checkpoint) and the evaluator up to `config.max_learner_restarts` times.

    A "replay" node holds the builder's own replay table (`Builder.replay_table`, e.g.
    R2D2's prioritized sequences) where it has one, which then feeds the learner; otherwise,
    with `config.unroll_queue == "replay"`, the Queue table through which unrolls reach the
    learner. With `config.eval_every > 0` an "evaluator" node runs
    the greedy policy on envs of its own. With `checkpoints`, the learner checkpoints there
    (and resumes from its `resume_step`); the learner node stops the program by `stop_rule`
    (default: the config's). With `video_dir`, each evaluation also writes a video there.

    Returns:
      The program; its "learner" group holds one node whose handle is the env workers'
      inference server and answers `stats()`.
    """
    # Env workers' processes fork from a server that imported their module (numpy, Gymnasium).
    program = runtime.Program(name, preload=(EnvWorker.__module__,))
    replay = None
    spec = env_factory.spec()
    table = agent_table(builder, spec)
    if table is None and config.unroll_queue == "replay":  # Always with learner processes.
        queue_spec = builder.queue_spec()
        table = unroll_table_spec(agent_step_specs(builder, spec), queue_spec.unroll_length,
                                  config.envs_per_group, max_unrolls(queue_spec, config))
    if table is not None:
        with program.group("replay"):
            replay = program.add_node(
                runtime.CourierNode(ReplayNode, [table], config.replay_backend, config.seed))
    # On a cluster (platform "ray") the learner lands where the accelerator is and env
    # workers on CPU machines; other platforms ignore resources.
    # Learner processes 1..N-1 of a group (`config.learner_processes`), each an accelerator's
    # node too; the "learner" node is process 0, which they join (builders/experiments/
    # distributed.py).
    followers = []
    if config.learner_processes > 1:
        with program.group("learner_follower", resources={"CPU": 1, "accelerator": 1}):
            followers = [program.add_node(runtime.CourierNode(
                LearnerFollower, i, config.learner_processes, follower_parts, builder,
                env_factory, config, replay)) for i in range(1, config.learner_processes)]
    # A restarted learner goes on from its newest checkpoint (`open_checkpoints`); env workers
    # and the evaluator reconnect to it at the same address.
    with program.group("learner", max_restarts=config.max_learner_restarts,
                       resources={"CPU": 1, "accelerator": 1}):
        learner = program.add_node(
            runtime.CourierNode(learner_node, builder, env_factory, config, replay, checkpoints,
                                stop_rule, followers))
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
        with program.group("evaluator", max_restarts=config.max_learner_restarts):
            program.add_node(runtime.CourierNode(Evaluator, builder, env_factory, learner, config,
                                                 video_dir))
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


def learner_node(builder: Builder[Any], env_factory: EnvFactory, config: ExperimentConfig,
                 replay: Any = None, checkpoints: Checkpoints | None = None,
                 stop_rule: StopRule | None = None, followers: Sequence[Any] = ()
                 ) -> LearnerNode:
    """The learner node with its parts, built in the node's process (its `CourierNode` calls
    this there).

    The update's compiles start first, in a thread, beside the rest of the start (the
    state's restore, the policy's first compile: `CompileAhead`).

    Args:
      builder, env_factory, config, checkpoints, stop_rule: as for `make_program`.
      replay: the replay node, where `make_program` added one: it holds the builder's own
        table (`agent_table`), which then feeds the learner, or else, with
        `config.unroll_queue == "replay"`, the unroll table through which unrolls go.
      followers: the other learner processes' nodes (`distributed.LearnerFollower`), which
        this one, process 0, forms a group with before JAX starts.
    """
    group = start_group(followers)
    spec = env_factory.spec()
    # On the host's CPU, as the state's init (`init_device`); uncommitted, so the learner
    # and the policy still take them onto their devices.
    with jax.default_device(init_device(jax.local_devices())):
        learner_key, inference_key = jax.random.split(jax.random.PRNGKey(config.seed))
    networks = builder.make_networks(spec)
    table = agent_table(builder, spec)
    client = None if replay is None else ReplayClient(replay)
    learner = builder.make_learner(networks, spec, learner_key,
                                   replay=None if table is None else client)
    schedule = LearningRateSchedule.of(
        builder, builder.make_training(networks, spec), config.total_env_steps)
    queue_spec = process_share(builder.queue_spec(), group.processes)
    wire = step_format(spec)
    stop = runtime.stop_event()
    feed, shapes = learner_feed(builder, spec, queue_spec, config, client, table, stop)
    policy_compiled = threading.Event()
    # Acting alone (`learn` off, the throughput benchmark's inference stage): no update to
    # compile and no batch to place; batches are dropped as they come, of any size.
    compiled = CompileAhead(learner, {size: wire.nest(batch) for size, batch in shapes.items()}
                            if config.learn else {},
                            after_first=policy_compiled, wanted=feed.backlog, stop=stop,
                            on_compiled=feed.allow)
    if not config.learn:
        for size in shapes:
            feed.allow(size)
    checkpointer, counter = open_checkpoints(checkpoints, learner, config,
                                             restarted=runtime.restart_count() > 0)
    group.share_state(learner)  # A restored state reaches every process.
    initial_state = builder.initial_state(spec, config.num_actors * config.envs_per_actor)
    inference = InferenceServer(
        ServedPolicy(builder.make_policy(networks), learner.params, inference_key, spec,
                     builder.extras_spec(spec), initial_state),
        InferenceSettings(num_workers=config.env_groups, envs_per_worker=config.envs_per_group,
                          unroll_length=queue_spec.unroll_length, overlap=queue_spec.overlap,
                          timeout_s=config.inference_timeout_ms / 1000.0,
                          shared_memory=config.transport == "shm"),
        on_unroll=feed.put, stop=stop, on_steps=counter.add_env_steps, compiled=policy_compiled)
    inference.set_params(learner.params, counter.snapshot().learner_steps)
    batches = Prefetch(feed, (lambda batch: learner.place(wire.nest(batch))) if config.learn
                       else (lambda batch: batch), stop)
    return LearnerNode(
        inference, batches, LearnerUpdate(learner, compiled, schedule, config,
                                          queue_spec.batch_size),
        counter, stop_rule or StopRule.of(config),
        LearnerStats(counter, inference, feed.size, lambda: compiled.compiled_at,
                     config.log_every_s), checkpointer, stop,
        learn=config.learn, group=group)


def follower_parts(builder: Builder[Any], env_factory: EnvFactory, config: ExperimentConfig,
                   replay: Any, stop: StopEvent) -> FollowerParts:
    """A follower learner process's parts, built once its group has formed
    (`distributed.LearnerFollower`): the learner, its share of each batch from the replay
    node's unroll table, and the update with the run's learning-rate schedule."""
    spec = env_factory.spec()
    networks = builder.make_networks(spec)
    with jax.default_device(init_device(jax.local_devices())):
        learner_key = jax.random.split(jax.random.PRNGKey(config.seed))[0]  # As process 0's.
    learner = builder.make_learner(networks, spec, learner_key)
    queue_spec = process_share(builder.queue_spec(), config.learner_processes)
    wire = step_format(spec)
    feed, shapes = learner_feed(builder, spec, queue_spec, config, ReplayClient(replay), None,
                                stop)
    no_policy = threading.Event()
    no_policy.set()  # No policy here to compile first.
    compiled = CompileAhead(learner, {size: wire.nest(batch) for size, batch in shapes.items()},
                            after_first=no_policy, wanted=feed.backlog, stop=stop,
                            on_compiled=feed.allow)
    schedule = LearningRateSchedule.of(
        builder, builder.make_training(networks, spec), config.total_env_steps)
    return FollowerParts(
        Prefetch(feed, lambda batch: learner.place(wire.nest(batch)), stop),
        LearnerUpdate(learner, compiled, schedule, config, queue_spec.batch_size))


def learner_feed(builder: Builder[Any], spec: EnvSpec | MultiAgentSpec, queue_spec: QueueSpec,
                 config: ExperimentConfig, replay: ReplayClient | None, table: TableSpec | None,
                 stop: StopEvent
                 ) -> tuple[UnrollFeed | ReplayFeed, dict[int, dict[str, jax.ShapeDtypeStruct]]]:
    """The learner's input, and the shapes of the batches it gives, by size, smallest first:
    batches sampled from the builder's own replay `table` where it has one, else unrolls in
    order (through `replay`'s unroll table with `config.unroll_queue == "replay"`)."""
    if table is not None:
        assert replay is not None, "make_program adds a replay node for the builder's table"
        size = queue_spec.batch_size
        return (ReplayFeed(replay, table.name, size, stop),
                {size: ReplayFeed.batch_shapes(abstract_batch(builder, spec, queue_spec, size))})
    sizes = batch_sizes(queue_spec, config)
    # Learner processes share the table, which alone bounds the unrolls waiting.
    feed = UnrollFeed(unroll_queue(queue_spec, config, replay), sizes, stop,
                      None if config.learner_processes > 1 else
                      {size: max_unrolls(queue_spec, config, size) for size in sizes})
    return feed, {size: abstract_batch(builder, spec, queue_spec, size) for size in sizes}


def abstract_batch(builder: Builder[Any], spec: EnvSpec | MultiAgentSpec, queue_spec: QueueSpec,
                   batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes and dtypes of a batch of `batch_size` unrolls, as the feed gives it."""
    return {name: jax.ShapeDtypeStruct(s.shape, s.dtype) for name, s in unroll_signature(
        agent_step_specs(builder, spec), queue_spec.unroll_length, (batch_size,)).items()}
