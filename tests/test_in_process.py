"""The in-process executions' skeleton (`in_process.InProcessRun`) around a program of two
members written here: reports, the stop rule, checkpoints, resume and the summary."""

import numpy as np
import pytest

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import latest_checkpoint
from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.in_process import Called, InProcessRun
from trellis.builders.experiments.stop import BUDGET, SIGNAL, StopRule


class TwoMembers:
    """Each call: 10 env steps of each member; member 1 finishes an episode of return 4, member
    0 one of return 2 on every second call. The state counts the calls."""

    num_members = 2

    def __init__(self):
        self.state = {"calls": np.zeros((), np.int32)}
        self.restored = None

    def restore(self, state, progress):
        self.state, self.restored = state, dict(progress)

    def call(self):
        calls = int(self.state["calls"]) + 1
        self.state = {"calls": np.asarray(calls, np.int32)}
        return Called({"loss": float(calls)}, {"event": calls} if calls == 2 else {},
                      record_now=calls == 2)

    def snapshots(self, elapsed_s, resumes):
        calls = int(self.state["calls"])
        return [CounterSnapshot(10 * calls, calls, calls // 2, (2.0,) * (calls // 2), (),
                                elapsed_s, resumes),
                CounterSnapshot(10 * calls, calls, calls, (4.0,) * calls, (), elapsed_s,
                                resumes)]

    def fields(self, snapshots):
        return {"member/1/episodes": snapshots[1].episodes}

    def summary(self, snapshots):
        return {"members": [s.episodes for s in snapshots]}


def _run(tmp_path, program, resume=None, total_env_steps=30):
    config = ExperimentConfig(total_env_steps=total_env_steps, stop_at_return=None)
    return InProcessRun(program, config, str(tmp_path), StopRule(total_env_steps), resume)


def test_reports_combine_the_members_until_the_rule_stops_and_the_end_is_checkpointed(tmp_path):
    run = _run(tmp_path, TwoMembers())
    reports = [run.advance(0.1) for _ in range(3)]
    assert [r.stopped_by for r in reports] == [None, None, BUDGET]
    first, second, last = reports
    assert first.stats["episodes"] == 1 and first.stats["mean_return"] == 4.0
    assert second.fields == {"member/1/episodes": 2, "event": 2} and second.record_now
    assert not last.record_now and last.stats["loss"] == 3.0
    # Members' window means 2 and 4; all episodes; counts are per member (lockstep).
    assert last.stats["mean_return"] == pytest.approx(3.0)
    assert (last.stats["episodes"], last.stats["env_steps"]) == (4, 30)
    assert last.stats["env_steps_per_s"] > 0
    ending = run.finish()
    assert ending.exit_code == 0 and ending.fields["members"] == [1, 3]
    assert ending.fields["steady_env_steps_per_s"] > 0
    step, progress = latest_checkpoint(str(tmp_path))
    # The first member's counters are checkpointed beside the state.
    assert step == 30 and progress["episodes"] == 1 and progress["resumes"] == 0


def test_a_resumed_run_goes_on_from_the_checkpoint_and_a_signal_ends_it(tmp_path):
    run = _run(tmp_path, TwoMembers())
    run.advance(0.1)
    run.checkpoint()
    run.finish()
    resume = latest_checkpoint(str(tmp_path))
    program = TwoMembers()
    resumed = _run(tmp_path, program, resume, total_env_steps=100)
    assert int(program.state["calls"]) == 1 and program.restored["env_steps"] == 10
    report = resumed.advance(0.1)
    assert report.stats["env_steps"] == 20 and report.stats["resumes"] == 1
    assert report.stats["elapsed_s"] >= resume[1]["elapsed_s"]
    stopped = resumed.stop()
    assert stopped.stopped_by == SIGNAL and stopped.stats["loss"] == 2.0
    assert "event" not in stopped.fields  # The call's own fields were in its report.
    assert resumed.finish().exit_code == 130
