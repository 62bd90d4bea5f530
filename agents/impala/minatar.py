"""IMPALA's `--preset=minatar` (docs/presets.md), chosen by itself for `minatar:` and gymnax's
`*-MinAtar` ids: the MinAtar paper's network (Young and Tian, 2019, section 4) with the
learning settings Trellis measured reaching the paper's Breakout return (AC(lambda=0.8)'s 17
within its 5M frames) on a 2-core machine (docs/benchmarks.md, "IMPALA's MinAtar preset").
The paper trains its agents online, in one env without batches, so it has no IMPALA settings
to take.
"""

from trellis.agents.presets import MINATAR, Preset

_MEASURED = "Trellis: measured on MinAtar Breakout, 2 cores (docs/benchmarks.md, \"IMPALA's " \
    "MinAtar preset\")"

_SETTINGS = {
    **MINATAR,
    # One update per 8 unrolls of 20 steps (160 env steps), always: with 16 unrolls the return
    # sat on its plateaus (near 6, then near 13) for up to 3M env steps in some seeds, and the
    # feed's auto batches (32-64 unrolls when the learner falls behind) gave fewer updates still.
    "unroll_length": 20,
    "batch_size": 8,
    "learner_batch": "fixed",
    # Constant: a run that stops at a return wants its rate until then. Falling linearly to 0
    # over the 5M budget (the IMPALA paper's schedule) took 1.14-1.42M env steps to 17 where
    # the constant rate took 0.78-0.94M, seed for seed.
    "learning_rate": 5e-3,
    "learning_rate_schedule": "constant",
    # Twice IMPALA's default: at 0.01 one run's policy collapsed (entropy 0, return 0).
    "entropy_cost": 0.02,
}
IMPALA_MINATAR = Preset(source=MINATAR.source, settings=_SETTINGS,
                        sources={name: _MEASURED for name in _SETTINGS if name not in MINATAR})
