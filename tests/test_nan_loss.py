"""A NaN in the loss stops the run with an error naming the learner step; the checkpoints kept
are the good ones from before it."""

import re

import jax
import numpy as np
import pytest

from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import (
    Checkpointer,
    checkpoint_dir,
    latest_checkpoint,
)
from trellis.builders.experiments.learner_update import FiniteCheck, NonFiniteLossError
from trellis.builders.experiments.session import run_experiment
from trellis.envs import GymnasiumFactory


class NanRewardLearner:
    """IMPALA's learner, fed NaN rewards once the run has a checkpoint: the real update then
    returns a NaN loss and NaN params, as a diverging run would."""

    def __init__(self, learner, directory: str):
        self._learner = learner
        self._directory = directory
        self.steps = 0
        self.poisoned_at: int | None = None

    def step(self, batch):
        self.steps += 1
        if self.poisoned_at is None and _has_checkpoint(self._directory):
            self.poisoned_at = self.steps
        if self.poisoned_at is not None:
            batch = dict(batch, reward=np.full_like(batch["reward"], np.nan))
        return self._learner.step(batch)

    def __getattr__(self, name):
        return getattr(self._learner, name)


LEARNERS: list[NanRewardLearner] = []  # The nodes get a copy of the builder: look here.


class NanRewardBuilder(ImpalaBuilder):
    def __init__(self, config, directory):
        super().__init__(config)
        self._directory = directory

    def make_learner(self, networks, spec, key, **kwargs):
        learner = NanRewardLearner(super().make_learner(networks, spec, key, **kwargs),
                                   self._directory)
        LEARNERS.append(learner)
        return learner


def _has_checkpoint(directory: str) -> bool:
    try:
        return Checkpointer(directory).latest_step() is not None
    except FileNotFoundError:
        return False


def test_nan_loss_stops_the_run_naming_the_step_and_keeps_the_good_checkpoint(tmp_path):
    LEARNERS.clear()
    run_dir = str(tmp_path / "run")
    directory = checkpoint_dir(run_dir)
    builder = NanRewardBuilder(ImpalaConfig(batch_size=8, unroll_length=10), directory)
    config = ExperimentConfig(num_actors=1, envs_per_actor=8, total_env_steps=200_000,
                              checkpoint_every_s=0.5, log_every_s=0.2, eval_every=0)

    summary = run_experiment(builder, GymnasiumFactory("CartPole-v1"), config, run_dir,
                             platform="local_mt", quiet=True)

    (learner,) = LEARNERS
    assert learner.poisoned_at is not None, "the run stopped before any checkpoint"
    assert summary["exit_code"] == 1 and summary["stopped_by"] == "error", summary
    match = re.search(r"NonFiniteLossError: learner step (\d+) gave non-finite metrics "
                      r"\(.*loss=nan", summary["error"])
    assert match, summary["error"]
    poisoned_step = int(match.group(1))
    assert poisoned_step == learner.poisoned_at  # The first update fed NaN, no later one.
    assert learner.steps - learner.poisoned_at in (0, 1)  # Found one update late at most.

    step, progress = latest_checkpoint(run_dir)
    assert progress["learner_steps"] < poisoned_step
    state, _ = Checkpointer(directory).restore(learner.state, step)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(state.params)))
    assert not all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(learner.params)), \
        "the learner's own params went NaN (else the test checks nothing)"


def test_finite_check_names_the_step_one_update_late():
    check = FiniteCheck()
    check.add({"loss": np.float32(1.0), "replay_size": 3}, learner_step=7)
    check.add({"loss": np.float32(np.inf), "grad_norm": np.float32(2.0)}, learner_step=8)
    with pytest.raises(NonFiniteLossError, match=r"^learner step 8 gave non-finite metrics "
                                                 r"\(loss=inf\)"):
        check.check()
    check.check()  # Reported once: nothing pending.
