"""R2D2's `--preset=atari` (docs/atari.md): SEED RL's R2D2 Atari settings (Espeholt et al.,
2020, "SEED RL: Scalable and Efficient Deep-RL with Accelerated Central Inference"; the
repository's gcp/train_atari.sh, atari/r2d2_main.py, agents/r2d2/learner.py and atari/env.py),
which follow the R2D2 paper (Kapturowski et al., 2019).

Where Trellis differs (docs/atari.md): the replay holds 5,000 sequences, not SEED's 100,000
(SEED stacks frames inside the network and stores single frames; Trellis stores the env's
stacked frames, 4x the memory: the table is allocated at its full size, 3.4 MB a sequence of
121 steps, so 5,000 take 16 GB and 100,000 would take 340 GB), learning starts when it is
full (SEED's 5,000 sequences too), the
network does not take the previous action and reward as inputs, and its conv torso is the
2013 DQN paper's smaller one, not the Nature DQN's that SEED uses.
"""

from trellis.agents.presets import Preset

_SETTINGS = {
    # Sequences: 80 steps learned from after a 40-step burn-in, a new one every 80 steps.
    "trace_length": 80,
    "burn_in": 40,
    "unroll_length": 80,
    "batch_size": 64,
    # Learning.
    "learning_rate": 1e-4,
    "adam_eps": 1e-3,
    "max_grad_norm": 80.0,
    "discount": 0.997,
    "n_step": 5,
    "value_rescaling_eps": 1e-3,
    "target_update_period": 400,
    "lstm_size": 512,
    # Prioritized replay; replay_ratio 0.75: each step is learned from 0.75 times on average,
    # and each step is in one sequence's trace. --replay_size raises the capacity where the
    # memory allows (10,000: 32 GB).
    "replay_size": 5_000,
    "min_replay_size": 5_000,
    "samples_per_insert": 0.75,
    "priority_exponent": 0.9,
    "importance_exponent": 0.6,
    "priority_eta": 0.9,
    # Exploration: env slot i of N acts with 0.4 ** (1 + 7 i / (N - 1)) (Ape-X's ladder).
    "epsilon": 0.4,
    "epsilon_alpha": 7.0,
    # The env (atari/env.py): whole games (no life loss as an end), no reward clipping (value
    # rescaling instead), the full action set, no sticky actions, up to 30 no-ops, 4 frames
    # skipped and 4 stacked.
    "episodic_life": False,
    "full_action_space": True,
    "repeat_action_probability": 0.0,
    "noop_max": 30,
    "frame_skip": 4,
    "frame_stack": 4,
    "frame_size": 84,
}
ATARI = Preset(source="SEED RL (Espeholt et al., 2020): gcp/train_atari.sh, atari/r2d2_main.py, "
                      "agents/r2d2/learner.py, atari/env.py",
               settings=_SETTINGS,
               sources={"replay_size": "Trellis: SEED RL holds 100,000 sequences of single frames; "
                                       "Trellis stores stacked frames (the docstring)"})
