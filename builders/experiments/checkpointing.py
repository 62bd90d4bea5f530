"""Checkpoints of a learner node: the learner state (any pytree) and the node's counters.

One checkpoint per saved env step under `<run dir>/checkpoints/<env_steps>/`, written by
orbax-checkpoint: `state/` holds the learner state (params, optimizer state, RNG key, step),
`progress/` a JSON dict of host-side counters (env steps, learner steps, episodes, the recent
returns, wall time), so a resumed run continues its counters and its return curve.

orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save (even with SIGKILL) leaves the previous checkpoints intact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from trellis.agents.common import with_learning_rate_factor, without_learning_rate_factor
from trellis.builders.contract.agent import KeepsReplay, Learner
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.counter import Counter

CHECKPOINT_SUBDIR = "checkpoints"
# Where a learner's replay (`KeepsReplay`) is saved beside the checkpoints (orbax owns
# CHECKPOINT_SUBDIR): one directory per step, only the newest kept (each may be gigabytes).
REPLAY_SUBDIR = "replay"
# Where checkpoints that cannot be read are moved (beside CHECKPOINT_SUBDIR), never deleted.
CORRUPT_SUBDIR = "corrupt_checkpoints"

T = TypeVar("T")


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


def _alone(ocp: types.ModuleType, **options: Any) -> Any:
    """Options of a checkpoint manager that this process alone uses, also as process 0 of a
    learner group (builders/experiments/distributed.py), where orbax would otherwise wait at
    barriers for the other processes, which hold the same state and never checkpoint. With
    them orbax does not create the directory (its `create` refuses them)."""
    return ocp.CheckpointManagerOptions(
        create=False, **options, multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()}))


def _reader(directory: str) -> Any:
    """A checkpoint manager of this process's own that reads `directory`'s checkpoints, with
    the handlers reading metadata needs (the one that saves keeps orbax's defaults)."""
    ocp = _ocp()
    return ocp.CheckpointManager(directory, options=_alone(ocp), item_handlers={
        "state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()})


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
        os.makedirs(self.directory, exist_ok=True)  # orbax's `create` refuses `_alone`'s.
        self._manager = ocp.CheckpointManager(self.directory,
                                              options=_alone(ocp, max_to_keep=max_to_keep))

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

    def wait(self) -> None:
        """Waits until a pending save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for a pending save, then releases orbax's threads."""
        self._manager.wait_until_finished()
        self._manager.close()


def open_checkpoints(checkpoints: Checkpoints | None, learner: Learner,
                     config: ExperimentConfig, restarted: bool = False
                     ) -> tuple[Checkpointer | None, Counter]:
    """A learner node's checkpointer (None without `checkpoints`) and its run's counter;
    where `checkpoints` resumes, both from its checkpoint: the learner's state is restored
    into `learner`, and the counter goes on from the saved counts.

    A `restarted` learner node (`max_learner_restarts`: its process died) goes on from the
    newest readable checkpoint its run wrote instead (`newest_readable`), or from
    `checkpoints`' own start where there is none yet.

    Raises:
      CheckpointError: the checkpoint to resume from is missing or does not fit.
    """
    if checkpoints is None:
        return None, Counter(config.return_window)
    step = checkpoints.resume_step
    if restarted and _steps_in(checkpoints.directory):
        # Before the checkpointer opens the directory: unreadable ones are moved out first.
        step = newest_readable(checkpoints.directory)[0]
    checkpointer = Checkpointer(checkpoints.directory, config.keep_checkpoints)
    if step is None:
        return checkpointer, Counter(config.return_window)
    state, progress = checkpointer.restore(learner.state, step)
    learner.restore(state)
    if isinstance(learner, KeepsReplay):
        items = restore_replay(learner, checkpoints.directory, step)
        print(f"[learner] checkpoint {step}: " + (
            f"its replay of {items} items restored" if items is not None else
            "no replay was saved with it (only a session's final checkpoint has one): the "
            "table refills before learning"), file=sys.stderr, flush=True)
    return checkpointer, Counter.restore(progress, config.return_window)


def save_replay(learner: KeepsReplay, directory: str, step: int) -> int:
    """Saves `learner`'s replay beside checkpoint `step` of the checkpoints `directory`, then
    removes the older ones; returns the items saved.

    Written to a temporary directory that is then renamed: a process killed meanwhile (its
    shutdown bound ran out) leaves the previous replay or none, never a part of one.
    """
    root = _replay_root(directory)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{step}.tmp-", dir=root)
    try:
        items = learner.save_replay(tmp)
        final = os.path.join(root, str(step))
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name in os.listdir(root):  # Older replays, and temporaries of killed saves.
        if name != str(step):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return items


def _replay_root(directory: str) -> str:
    """The run's replay directory, beside its checkpoints `directory`."""
    return os.path.join(os.path.dirname(directory), REPLAY_SUBDIR)


def restore_replay(learner: KeepsReplay, directory: str, step: int) -> int | None:
    """Restores into `learner` the replay saved beside checkpoint `step` of the checkpoints
    `directory` (`save_replay`); returns the items restored, or None where none was saved
    with that checkpoint (a periodic one: the table refills before learning)."""
    path = os.path.join(_replay_root(directory), str(step))
    if not os.path.isdir(path):
        return None
    return learner.restore_replay(path)


def latest_checkpoint(run_dir: str) -> tuple[int, dict[str, Any]]:
    """Finds and reads the newest readable checkpoint of a run directory, arrays included
    (`newest_readable` of its checkpoints directory).

    Meant for the launcher before it starts a resumed run, so that a missing or damaged
    checkpoint is one clear error (or warning) there instead of a node failing deep inside
    orbax.

    Returns:
      (step, progress) of the checkpoint.

    Raises:
      CheckpointError: none found, or none can be read; the message names the path.
    """
    return newest_readable(checkpoint_dir(run_dir))


def newest_readable(directory: str) -> tuple[int, dict[str, Any]]:
    """(step, progress) of the newest checkpoint in `directory` whose arrays and progress can
    be read, for a run that goes on from it (a resume, a restarted learner).

    Newer ones that cannot (a disk that filled up, a copy cut short, a file truncated: orbax
    then fails with e.g. "Failed to read Metadata file") are moved to `CORRUPT_SUBDIR` beside
    `directory`, not deleted, with one warning line on stderr naming them and the step used:
    left in place they would stay the newest, and the run would neither checkpoint below them
    nor keep them past `keep_checkpoints`.

    Raises:
      CheckpointError: `directory` holds no checkpoint, or none that can be read.
    """
    return _newest(directory, functools.partial(_read_progress, directory), set_aside=True)


def read_newest(directory: str, read: Callable[[int], T]) -> tuple[int, T]:
    """(step, `read(step)`) of the newest checkpoint in `directory` that `read` reads, for a
    reader (evaluate.py, `trellis.load`): as `newest_readable`, newer ones that it cannot
    read (`read` raised `CheckpointError`) are passed over with one warning line, but left
    where they are.

    Args:
      directory: a checkpoints directory.
      read: reads checkpoint `step` (e.g. restores it onto a target: on another machine's
        devices, only a restore with a target reads a checkpoint).

    Raises:
      CheckpointError: `directory` holds no checkpoint, or none that `read` reads (the
        newest's error).
    """
    return _newest(directory, read, set_aside=False)


def _newest(directory: str, read: Callable[[int], T], set_aside: bool) -> tuple[int, T]:
    """(step, `read(step)`) of the newest checkpoint in `directory` that `read` reads; the
    newer ones, one warning line, and with `set_aside` moved to `CORRUPT_SUBDIR`."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"no checkpoints in {directory} (the directory does not exist)")
    steps = _steps_in(directory)
    if not steps:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    bad: list[tuple[int, CheckpointError]] = []
    with _without_closed_loop_reports():
        for step in steps:
            try:
                value = read(step)
            except CheckpointError as e:
                bad.append((step, e))
                continue
            if bad and set_aside:
                _set_aside(directory, bad, step)
            elif bad:
                print(f"[restore] warning: checkpoint {_listed(bad)} cannot be read "
                      f"({bad[0][1]}); using checkpoint {step}, the newest readable one "
                      f"(left in place)", file=sys.stderr, flush=True)
            return step, value
    raise CheckpointError(f"no readable checkpoint in {directory}: {bad[0][1]}")


def _steps_in(directory: str) -> list[int]:
    """The steps of the complete checkpoints in `directory` (none if it does not exist),
    newest first (orbax names each by its step; one being written has a temporary name until
    it is complete)."""
    if not os.path.isdir(directory):
        return []
    return sorted((int(name) for name in os.listdir(directory)
                   if name.isdigit() and os.path.isdir(os.path.join(directory, name))),
                  reverse=True)


def _read_progress(directory: str, step: int) -> dict[str, Any]:
    """Checkpoint `step`'s progress, once its arrays are read too: the only sure test that
    they are intact.

    Raises:
      CheckpointError: it cannot be read, or its progress lacks the counters.
    """
    ocp = _ocp()
    path = os.path.join(directory, str(step))
    try:
        manager = _reader(directory)
    except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types.
        raise CheckpointError(f"cannot read checkpoints in {directory}: {_one_line(e)}") from e
    try:
        # Onto one device of this process: without a target, orbax places the arrays as they
        # were saved and refuses ("Topology mismatch") where the run had other devices.
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                              manager.item_metadata(step)["state"])
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()))
        progress = dict(restored.progress)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(e)}") from e
    finally:
        manager.close()
    for name in ("env_steps", "learner_steps"):
        if not isinstance(progress.get(name), int):
            raise CheckpointError(f"checkpoint {path}: progress has no integer {name!r}")
    return progress


@contextlib.contextmanager
def _without_closed_loop_reports() -> Iterator[None]:
    """Inside, the reports of tensorstore reads that end after orbax has closed their event
    loop are dropped: a damaged checkpoint's failed read leaves dozens, each a "RuntimeError:
    Event loop is closed" traceback (through `sys.unraisablehook`) before its one warning line.
    Any other unraisable error is reported as before."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _set_aside(directory: str, bad: list[tuple[int, CheckpointError]], used: int) -> None:
    """Moves the unreadable checkpoints `bad` to `CORRUPT_SUBDIR` beside `directory`, saying
    so in one line."""
    corrupt = os.path.join(os.path.dirname(directory), CORRUPT_SUBDIR)
    os.makedirs(corrupt, exist_ok=True)
    for step, _ in bad:
        target = os.path.join(corrupt, str(step))
        suffix = 1
        while os.path.exists(target):  # Set aside before, by an earlier resume.
            target = os.path.join(corrupt, f"{step}.{suffix}")
            suffix += 1
        os.rename(os.path.join(directory, str(step)), target)
    print(f"[run] warning: checkpoint {_listed(bad)} cannot be read ({bad[0][1]}); moved to "
          f"{corrupt}; resuming from checkpoint {used}", file=sys.stderr, flush=True)


def _listed(bad: list[tuple[int, CheckpointError]]) -> str:
    """The steps of the unreadable checkpoints `bad`, for a warning line."""
    return ", ".join(str(step) for step, _ in bad)


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
    # A reader of its own: the launcher's check has no Checkpointer.
    manager = _reader(directory)
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
