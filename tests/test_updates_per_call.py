"""ES and AlphaZero make one generation or one self-play iteration per compiled call on anakin:
`--updates_per_call` is 1 for them there, and another value is refused in one line (exit 2)
rather than ignored."""

from __future__ import annotations

import pytest

from trellis.launch import flags
from trellis.launch import run as run_py

# Tiny runs: without the refusal they would train, and end at once.
AGENTS = {
    "es": ["--env=gymnax:CartPole-v1", "--population_size=8", "--total_env_steps=1000"],
    "alphazero": ["--env=pgx:tic_tac_toe", "--unroll_length=9", "--batch_size=8",
                  "--num_simulations=2", "--eval_every_updates=0", "--total_env_steps=100"],
}


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_one_update_per_call_by_default_on_anakin(agent):
    run = flags.parse([f"--agent={agent}", "--platform=anakin", *AGENTS[agent]])
    assert run.options.updates_per_call == 1
    assert run.platform().updates_per_call == 1


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_another_value_is_refused_in_one_line(agent, tmp_path, capsys):
    code = run_py.main([f"--agent={agent}", "--platform=anakin", *AGENTS[agent],
                        "--updates_per_call=4", "--quiet", f"--logdir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--updates_per_call must be 1, got 4" in lines[0], err
