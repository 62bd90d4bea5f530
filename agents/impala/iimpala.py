"""Independent IMPALA for the command line (`--agent=iimpala`): IMPALA for each policy of a
multi-agent env (agents/impala/multi_agent.py); nothing of IMPALA is copied."""

from trellis.agents.impala.multi_agent import IImpalaBuilder, IImpalaConfig

# The names agents/registry.py looks up.
Builder = IImpalaBuilder
Config = IImpalaConfig

__all__ = ["Builder", "Config", "IImpalaBuilder", "IImpalaConfig"]
