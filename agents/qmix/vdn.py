"""VDN (Sunehag et al., 2018) for the command line (`--agent=vdn`): QMIX's agent with the
team's Q the sum of its agents' (agents/qmix/config.VDNConfig)."""

from trellis.agents.qmix.builder import QMIXBuilder
from trellis.agents.qmix.config import VDNConfig

# The names agents/registry.py looks up.
Builder = QMIXBuilder
Config = VDNConfig

__all__ = ["Builder", "Config", "QMIXBuilder", "VDNConfig"]
