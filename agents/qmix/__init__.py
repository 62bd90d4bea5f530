"""QMIX (Rashid et al., 2018) and VDN (Sunehag et al., 2018): value-decomposition Q-learning
on cooperative multi-agent envs, learned as PQN learns (Q(lambda) over parallel envs, no
replay, no target network; JaxMARL's PQN-VDN). `--agent=qmix`; `--agent=vdn` is
agents/qmix/vdn.py."""

from trellis.agents.qmix.builder import QMIXBuilder
from trellis.agents.qmix.config import QMIXConfig, VDNConfig

# The names agents/registry.py looks up.
Builder = QMIXBuilder
Config = QMIXConfig

__all__ = ["Builder", "Config", "QMIXBuilder", "QMIXConfig", "VDNConfig"]
