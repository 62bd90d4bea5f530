"""Checkpoints of a learner node: the learner state (any pytree) and the node's counters.

One checkpoint per saved env step under `<run dir>/checkpoints/<env_steps>/`, written by
orbax-checkpoint: `state/` holds the learner state (params, optimizer state, RNG key, step),
`progress/` a JSON dict of host-side counters (env steps, learner steps, episodes, the recent
returns, wall time), so a resumed run continues its counters and its return curve.

orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save (even with SIGKILL) leaves the previous checkpoints intact.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import types
from typing import Any

import jax
import jax.numpy as jnp

from trellis.agents.common import with_learning_rate_factor, without_learning_rate_factor
from trellis.builders.contract.agent import Learner
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.counter import Counter

CHECKPOINT_SUBDIR = "checkpoints"


class CheckpointError(Exception):
    """A checkpoint is missing or cannot be read; the message names the path."""


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """Where a learner node checkpoints, and the checkpoint it resumes from (None: a new run).

    `directory` must be absolute (orbax requires it): `checkpoint_dir(run_dir)` gives one.
    """

    directory: str
    resume_step: int | None = None


def checkpoint_dir(run_dir: str) -> str:
    """Where a run directory keeps its checkpoints (an absolute path: orbax requires one)."""
    return os.path.abspath(os.path.join(run_dir, CHECKPOINT_SUBDIR))


def _ocp() -> types.ModuleType:
    # orbax is heavy (tensorstore, asyncio); imported only where checkpoints are used. It
    # ships no annotations (no py.typed): a module, typed as one, whose names are Any.
    ocp = importlib.import_module("orbax.checkpoint")

    # Without a target, orbax warns that restoring is "UNSAFE" across topologies; we validate
    # checkpoints on the machine that wrote them, so the warning would only confuse users.
    logging.getLogger("absl").setLevel(logging.ERROR)
    return ocp


class Checkpointer:
    """Saves and restores (learner state, progress) pairs, keeping the last `max_to_keep`.

    Saves are asynchronous (the learner loop goes on while orbax writes); `close()` waits for
    the last one. Use from one thread.

    Args:
      directory: the checkpoints directory (created if missing).
      max_to_keep: how many of the newest checkpoints to keep.
    """

    def __init__(self, directory: str, max_to_keep: int = 3):
        ocp = _ocp()
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        step: int | None = self._manager.latest_step()
        return step

    def save(self, step: int, state: Any, progress: dict[str, Any]) -> bool:
        """Starts writing checkpoint `step` (env steps); False if that step is already saved.

        `state` must not be mutated afterwards (JAX arrays never are).
        """
        ocp = _ocp()
        latest = self._manager.latest_step()
        if latest is not None and step <= latest:
            return False
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_without_empty(state)),
            progress=ocp.args.JsonSave(progress),
        )
        return bool(self._manager.save(step, args=args))

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Reads checkpoint `step` (default: the latest) into the structure of `target`.

        A checkpoint written before the learning-rate schedule (a158f3b), whose optimizer
        states lack its factor, is read too; the factor is then `target`'s.

        Args:
          target: a pytree like the saved state (e.g. a freshly built learner's state); the
            restored arrays get its shapes, dtypes and shardings.
          step: which checkpoint.

        Returns:
          (state, progress).

        Raises:
          CheckpointError: no such checkpoint, its arrays do not fit `target` (the message
            names the first that does not), or it cannot be read.
        """
        step = self._manager.latest_step() if step is None else step
        fitting = _fitting(self.directory, step, target)
        state, progress = self._restore(fitting, step)
        if fitting is not target:
            state = with_learning_rate_factor(state, target)
        return state, progress

    def _restore(self, target: Any, step: int) -> tuple[Any, dict[str, Any]]:
        ocp = _ocp()
        path = os.path.join(self.directory, str(step))
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(_without_empty(target)),
            progress=ocp.args.JsonRestore(),
        )
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types.
            raise CheckpointError(f"cannot restore checkpoint {path}: {_one_line(e)}") from e
        state = jax.tree.map(lambda t, r: t if _empty(t) else r, target, restored.state)
        return state, dict(restored.progress)

    def close(self) -> None:
        """Waits for a pending save, then releases orbax's threads."""
        self._manager.wait_until_finished()
        self._manager.close()


def open_checkpoints(checkpoints: Checkpoints | None, learner: Learner,
                     config: ExperimentConfig) -> tuple[Checkpointer | None, Counter]:
    """A learner node's checkpointer (None without `checkpoints`) and its run's counter;
    where `checkpoints` resumes, both from its checkpoint: the learner's state is restored
    into `learner`, and the counter goes on from the saved counts.

    Raises:
      CheckpointError: the checkpoint to resume from is missing or does not fit.
    """
    if checkpoints is None:
        return None, Counter(config.return_window)
    checkpointer = Checkpointer(checkpoints.directory, config.keep_checkpoints)
    if checkpoints.resume_step is None:
        return checkpointer, Counter(config.return_window)
    state, progress = checkpointer.restore(learner.state, checkpoints.resume_step)
    learner.restore(state)
    return checkpointer, Counter.restore(progress, config.return_window)


def latest_checkpoint(run_dir: str) -> tuple[int, dict[str, Any]]:
    """Finds and reads the newest checkpoint of a run directory, arrays included.

    Meant for the launcher before it starts a resumed run, so that a missing or damaged
    checkpoint is one clear error there instead of a node failing deep inside orbax.

    Returns:
      (step, progress) of the newest checkpoint.

    Raises:
      CheckpointError: none found, or it cannot be read; the message names the path.
    """
    directory = checkpoint_dir(run_dir)
    if not os.path.isdir(directory):
        raise CheckpointError(f"no checkpoints in {directory} (the directory does not exist)")
    ocp = _ocp()
    try:
        manager = ocp.CheckpointManager(directory)
        step = manager.latest_step()
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"cannot read checkpoints in {directory}: {_one_line(e)}") from e
    if step is None:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    path = os.path.join(directory, str(step))
    try:
        # Reading the arrays is the only sure test that they are intact.
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), progress=ocp.args.JsonRestore()))
        progress = dict(restored.progress)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(e)}") from e
    finally:
        manager.close()
    for name in ("env_steps", "learner_steps"):
        if not isinstance(progress.get(name), int):
            raise CheckpointError(f"checkpoint {path}: progress has no integer {name!r}")
    return step, progress


def check_resumable(run_dir: str, step: int, target: Any) -> None:
    """Checks that checkpoint `step` of `run_dir` fits `target` (a pytree of arrays or of
    `jax.ShapeDtypeStruct`s: what `Checkpointer.restore` will be given), reading only its
    metadata: for the launcher, before it starts the nodes that restore it.

    Raises:
      CheckpointError: it does not fit (the message names the first array that does not), or
        it cannot be read.
    """
    _fitting(checkpoint_dir(run_dir), step, target)


def _fitting(directory: str, step: int | None, target: Any) -> Any:
    """`target`, or its form from before the learning-rate schedule, whichever checkpoint
    `step`'s arrays fit, by their metadata: orbax's own error for a misfit names no array, and
    the restore it fails leaves callbacks that print a screenful of tracebacks at exit.

    Raises:
      CheckpointError: neither fits, or there is no such checkpoint.
    """
    path = os.path.join(directory, str(step))
    if step is None or not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint to restore in {directory}")
    ocp = _ocp()
    # A reader of its own, with the handlers that reading metadata needs: the launcher's check
    # has no Checkpointer, and the one that saves keeps orbax's defaults.
    manager = ocp.CheckpointManager(directory, item_handlers={
        "state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()})
    try:
        saved = _shapes(manager.item_metadata(step)["state"])
    except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types.
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(e)}") from e
    finally:
        manager.close()
    wanted = _shapes(target)
    if saved == wanted:
        return target
    legacy = without_learning_rate_factor(target)
    # (A target with no factor to drop is its own legacy form: its shapes are `wanted`, which
    # were not `saved`.)
    if saved == _shapes(legacy):
        return legacy
    raise CheckpointError(
        f"checkpoint {path} does not fit the state this run's settings make: "
        f"{_misfit(saved, wanted)}; resume with the settings the run was made with (its "
        f"config.json holds them; flags given with --resume override them)")


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{path: shape} of the arrays a checkpoint of `tree` holds (zero-size ones are not
    saved), the path's keys by name or index, whatever kind of node holds them (a saved
    dataclass or named tuple is read back as a dict)."""
    def name(key: Any) -> str:
        return str(next(getattr(key, a) for a in ("key", "name", "idx") if hasattr(key, a)))

    def shape(leaf: Any) -> tuple[int, ...]:  # A typed PRNG key is saved as its key data.
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
            return tuple(jax.eval_shape(jax.random.key_data, leaf).shape)
        return tuple(leaf.shape)

    return {"/".join(name(k) for k in path): shape(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(_without_empty(tree))}


def _misfit(saved: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]]) -> str:
    """The first array that differs (a shape before a missing array, the params' before their
    optimizer state's), and how many others do."""
    differ = sorted((path for path in saved.keys() | wanted.keys()
                     if saved.get(path) != wanted.get(path)),
                    key=lambda path: (path not in saved or path not in wanted,
                                      "opt_state" in path, path))
    path = differ[0]
    if path not in wanted:
        first = f"it holds {path} {saved[path]}, which this run's state has not"
    elif path not in saved:
        first = f"this run's state has {path} {wanted[path]}, which it does not hold"
    else:
        first = f"{path} is {saved[path]} there and {wanted[path]} here"
    others = len(differ) - 1
    return first + (f" ({others} other array{'s' * (others > 1)} too)" if others else "")


def _empty(x: Any) -> bool:
    return getattr(x, "size", 1) == 0


def _without_empty(tree: Any) -> Any:
    """`tree` with its zero-size arrays as None: orbax refuses to save them, and they hold
    nothing (an MJX env's state has some, e.g. no actuator activations); restoring takes them
    from the target."""
    return jax.tree.map(lambda x: None if _empty(x) else x, tree)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
