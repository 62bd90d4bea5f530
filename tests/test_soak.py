"""benchmarks/soak.py for 2 minutes: env workers SIGKILLed every 10-20 s are all restarted, env
steps go on every minute, memory holds, and the program stops cleanly on SIGTERM."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_two_minute_soak():
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "soak.py"), "--minutes=2",
         "--kill_every=10,20"],
        capture_output=True, text=True, timeout=400, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, (result["verdicts"], out.stderr[-3000:])
    assert all(result["verdicts"].values())
    kills = result["kills"]
    assert len(kills) >= 4  # 2 minutes, one kill every 10-20 s after the first env steps.
    assert all(k["new_pid"] not in (None, k["pid"]) for k in kills)
    assert sum(result["summary"]["node_restarts"].values()) == len(kills)
    assert [m["env_steps_per_s"] > 0 for m in result["per_minute"]] == [True, True]  # 1 min, end.
    assert result["stop"] == {"exit_code": 130, "stop_s": result["stop"]["stop_s"],
                              "left_behind": []}
    assert result["summary"]["stopped_by"] == "signal"
    assert {"launcher", "learner", "actor/0", "actor/1"} <= set(result["processes"]["end"])
