"""IMPALA's `--preset=atari` (docs/atari.md): the IMPALA paper's Atari settings (Espeholt et
al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", the appendix's Atari hyper-parameters, and its Figure 3 for the network).

Where Trellis differs from the paper (docs/atari.md has the table): Adam instead of RMSProp,
and no LSTM by default (`--core=lstm` adds the paper's; the feed-forward agent steps faster on
one GPU). The learning rate falls linearly to 0 over the run's env-step budget, as the paper's
does over its frames.
"""

from trellis.agents.presets import Preset

_SETTINGS = {
    # Network: the deep residual torso (Figure 3, right).
    "pixel_torso": "resnet",
    # Learning.
    "learning_rate": 6e-4,
    "learning_rate_schedule": "linear",
    "entropy_cost": 0.01,
    "baseline_cost": 0.5,
    "max_grad_norm": 40.0,
    "unroll_length": 20,
    "batch_size": 32,
    # The paper's 32 unrolls per update, not auto's 128-256 with 14 x 32 envs: the deep
    # torso's update over 256 unrolls needs 27 GiB of temporaries (its compiled memory
    # analysis) and ran an H100 (80 GB) out of memory, and at 32 the learner still waits for
    # the envs (Pong on an H200: queue mostly empty, GPU 22% busy; docs/atari.md), so auto would
    # only give fewer updates per frame.
    "learner_batch": "fixed",
    "discount": 0.99,
    "reward_clip": 1.0,
    # The env: the game ends an episode at each lost life; 4 frames skipped (max-pooled) and
    # 4 stacked, 84 x 84 grey, up to 30 no-ops at the start.
    "episodic_life": True,
    "frame_skip": 4,
    "frame_stack": 4,
    "frame_size": 84,
    "noop_max": 30,
}
ATARI = Preset(
    source="Espeholt et al. (2018), IMPALA, the appendix's Atari hyper-parameters and Figure 3",
    settings=_SETTINGS,
    sources={"learner_batch": "Trellis: the paper's 32 unrolls per update, fixed (the comment "
                              "above says why)"})
