"""The learner across processes (builders/experiments/distributed.py): a `jax.distributed`
group of learner processes, here on one machine with JAX's CPU (gloo) collectives."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

# One learner process of a group of `processes`: IMPALA's learner, a tiny network, UPDATES
# updates on fixed global batches of B unrolls, of which this process feeds its share
# (B / processes columns, in process order); then one agreement of the group. Prints its
# params and the agreement as JSON.
SCRIPT = """
import json, sys
process, processes, port = (int(a) for a in sys.argv[1:4])
from trellis.builders.experiments import distributed
group = (distributed.initialize(f"127.0.0.1:{port}", processes, process) if processes > 1
         else distributed.LearnerGroup())
import jax
import numpy as np
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.envs import EnvSpec

B, T, UPDATES = 4, 3, 3
spec = EnvSpec((3,), "float32", 2, (), "int32")
builder = ImpalaBuilder(ImpalaConfig(hidden_sizes=(8,), batch_size=B, unroll_length=T))
learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0))
group.share_state(learner)
share = slice(process * B // processes, (process + 1) * B // processes)
for seed in range(UPDATES):
    rng = np.random.default_rng(seed)
    batch = {
        "obs": rng.normal(size=(T + 1, B, 3)).astype(np.float32),
        "action": rng.integers(0, 2, (T + 1, B)).astype(np.int32),
        "logits": rng.normal(size=(T + 1, B, 2)).astype(np.float32),
        "reward": rng.normal(size=(T + 1, B)).astype(np.float32),
        "terminated": rng.random((T + 1, B)) < 0.2,
        "truncated": np.zeros((T + 1, B), bool),
        "first": rng.random((T + 1, B)) < 0.2,
    }
    learner.step(learner.place({k: v[:, share] for k, v in batch.items()}))
# Process 0 is ready at env step 2**31 + 5 (past int32); the last of several is stopping.
turn = group.agree(ready=process == 0, stopping=processes > 1 and process == processes - 1,
                   env_steps=(2**31 + 5) if process == 0 else 7)
params = [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(learner.params))]
print(json.dumps({"params": params, "devices": len(learner.mesh.devices.flat),
                  "stop": turn.stop, "go": turn.go, "env_steps": turn.env_steps}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _learner_group(processes: int, timeout_s: float = 240) -> list[dict]:
    """Runs SCRIPT as `processes` processes of one group (one CPU device each)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    port = _free_port()
    children = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(i), str(processes),
                                  str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for i in range(processes)]
    results = []
    try:
        for i, child in enumerate(children):
            out, err = child.communicate(timeout=timeout_s)
            assert child.returncode == 0, f"process {i} failed:\n{err[-4000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def test_two_learner_processes_give_one_process_params_on_the_same_global_batch():
    """Gradients all-reduced over two processes' devices, each fed half of every batch: the
    params after the updates are one process's on the whole batches, within 1e-5; the
    group agrees as one (any stopping stops all, the coordinator's env steps)."""
    one, = _learner_group(1)
    two = _learner_group(2)
    assert one["devices"] == 1 and [r["devices"] for r in two] == [2, 2]
    for result in two:
        assert len(result["params"]) == len(one["params"])
        for a, b in zip(one["params"], result["params"], strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
        assert (result["stop"], result["go"], result["env_steps"]) == (True, False, 2**31 + 5)
    # A group of one: ready and not stopping itself, so it goes.
    assert (one["stop"], one["go"]) == (False, True)
    # The updates changed the params (the comparison is not of two inits).
    init = _init_params()
    assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-4
               for a, b in zip(one["params"], init, strict=True))


def _init_params() -> list:
    import jax

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.envs import EnvSpec

    spec = EnvSpec((3,), "float32", 2, (), "int32")
    builder = ImpalaBuilder(ImpalaConfig(hidden_sizes=(8,), batch_size=4, unroll_length=3))
    learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0),
                                   devices=jax.local_devices()[:1])
    return [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(learner.params))]
