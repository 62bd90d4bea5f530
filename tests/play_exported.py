"""Plays an exported policy with jax, numpy and gymnasium only, no Trellis: the user's side of
`LoadedPolicy.export` (launch/loaded_policy.py), run by tests/test_api.py in a process of its own.

    python tests/play_exported.py DIR ENV_ID EPISODES

loads DIR/policy.jax (`jax.export.deserialize`) and DIR/spec.json, plays EPISODES episodes of
the Gymnasium env ENV_ID (seeds 0, 1, ...) with the policy's greedy actions, and prints one JSON
line: the returns, and the top-level packages imported.
"""

import json
import os
import sys

import gymnasium as gym
import jax
import numpy as np


def main(directory: str, env_id: str, episodes: int) -> None:
    with open(os.path.join(directory, "spec.json")) as f:
        spec = json.load(f)
    assert spec["format"] == "trellis.policy/1" and not spec["recurrent"], spec
    with open(os.path.join(directory, "policy.jax"), "rb") as f:
        policy = jax.jit(jax.export.deserialize(bytearray(f.read())).call)
    dtype = np.dtype(spec["observation"]["dtype"])
    env = gym.make(env_id)
    returns = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = np.asarray(policy(np.asarray(obs, dtype)[None]))[0]  # A batch of one.
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    packages = sorted({name.split(".")[0] for name in sys.modules})
    print(json.dumps({"returns": returns, "packages": packages}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
