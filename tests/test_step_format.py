"""The step wire format: the fields of a step, its shared slots, the multi-agent round trip."""

import subprocess
import sys

import numpy as np

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.step_format import (
    pack_hello,
    step_format,
    step_specs,
    unpack_hello,
)
from trellis.envs import EnvSpec
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep

SPEC = EnvSpec((3,), "float32", 4, (), "int32")
# Two agents with different observations and actions, and a global state.
MULTI = MultiAgentSpec(("a", "b"), {"a": EnvSpec((2,), "float32", 3, (), "int32"),
                                    "b": EnvSpec((5,), "float32", 2, (), "int32")}, (7,))


def test_a_single_agent_step_and_what_is_recorded_of_it():
    fmt = step_format(SPEC)
    assert list(fmt.inputs) == ["obs", "reward", "terminated", "truncated", "first"]
    assert fmt.inputs["obs"] == ArraySpec((3,), "float32")
    assert fmt.actions == {"action": ArraySpec((), "int32")} and not fmt.multi_agent
    state = {"h": np.zeros((6, 8), np.float32)}  # 6 slots' rows of the policy state.
    recorded = step_specs(SPEC, {"logits": ArraySpec((4,), "float32")}, state)
    assert list(recorded) == ["obs", "reward", "terminated", "truncated", "first", "action",
                              "logits", "state/h"]
    assert recorded["state/h"] == ArraySpec((8,), "float32")  # One slot's row.


def test_the_shared_slots_hold_a_workers_step_its_episodes_and_its_actions():
    layout = step_format(SPEC).shm_layout(num_envs=4)
    assert layout == {"obs": ((4, 3), "float32"), "reward": ((4,), "float32"),
                      "terminated": ((4,), "bool"), "truncated": ((4,), "bool"),
                      "first": ((4,), "bool"), "episodes": ((4, 2), "float64"),
                      "num_episodes": ((), "int64"), "action": ((4,), "int32")}


def test_a_channels_hello_names_the_worker_and_its_run():
    assert unpack_hello(pack_hello(13, 2**62 - 1)) == (13, 2**62 - 1)


def test_a_multi_agent_step_crosses_as_fields_and_comes_back_as_the_policy_sees_it():
    fmt = step_format(MULTI)
    assert fmt.agents == ("a", "b")
    assert fmt.actions == {"action/a": ArraySpec((), "int32"), "action/b": ArraySpec((), "int32")}
    rng = np.random.default_rng(0)
    k = 3
    step = MultiAgentStep(
        obs={"a": rng.normal(size=(k, 2)), "b": rng.normal(size=(k, 5))},
        reward={"a": rng.normal(size=k), "b": rng.normal(size=k)},
        terminated={"a": rng.random(k) < 0.5, "b": rng.random(k) < 0.5},
        truncated={"a": rng.random(k) < 0.5, "b": rng.random(k) < 0.5},
        alive={"a": rng.random(k) < 0.5, "b": rng.random(k) < 0.5},
        first=rng.random(k) < 0.5, global_state=rng.normal(size=(k, 7)))
    fields = fmt.flatten(step)
    assert set(fields) == set(fmt.inputs)
    seen = fmt.policy_obs(fields)
    for name in ("obs", "reward", "terminated", "truncated", "alive"):
        for agent in ("a", "b"):
            np.testing.assert_array_equal(getattr(seen, name)[agent], getattr(step, name)[agent])
    np.testing.assert_array_equal(seen.global_state, step.global_state)
    actions = {"a": np.array([0, 1, 2]), "b": np.array([1, 0, 1])}
    assert fmt.env_actions(fmt.action_fields(actions)) == actions


def test_recorded_multi_agent_unrolls_nest_per_agent_for_the_learner():
    fmt = step_format(MULTI)
    extras = {"logits": {"a": ArraySpec((3,), "float32"), "b": ArraySpec((2,), "float32")}}
    recorded = step_specs(MULTI, extras, {"h": np.zeros((4, 6), np.float32)})
    assert recorded["logits/a"].shape == (3,) and recorded["logits/b"].shape == (2,)
    batch = {name: np.zeros((5, 4) + s.shape, s.dtype) for name, s in recorded.items()}
    nested = fmt.nest(batch)
    assert set(nested) == {"obs", "first", "action", "logits", "state/h"}
    assert set(nested["action"]) == {"a", "b"} and nested["logits"]["b"].shape == (5, 4, 2)
    assert nested["obs"].obs["b"].shape == (5, 4, 5)


def test_the_wire_format_and_the_env_worker_do_not_import_jax():
    """Env worker processes import these; JAX would cost each 1-2 s of start-up."""
    code = ("import sys\n"
            "import trellis.builders.experiments.env_worker\n"
            "import trellis.builders.experiments.step_format\n"
            "assert 'jax' not in sys.modules, 'jax was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
