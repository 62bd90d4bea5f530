"""Independent IMPALA for the command line (`--agent=iimpala`): IMPALA for each policy of a
multi-agent env (agents/impala/multi_agent.py); nothing of IMPALA is copied."""

from trellis.agents.impala.multi_agent import IImpalaBuilder, IImpalaConfig

# The names agents/registry.py looks up; without --env, MPE's simple_spread (N=3) on every
# platform (PettingZoo's mpe2 on the host, JaxMARL's on anakin).
Builder = IImpalaBuilder
Config = IImpalaConfig
_HOST = {"env": "pettingzoo:mpe2/simple_spread_v3"}
PLATFORM_DEFAULTS = {"local_mt": _HOST, "local_mp": _HOST, "ray": _HOST,
                     "anakin": {"env": "jaxmarl:MPE_simple_spread_v3"}}

__all__ = ["PLATFORM_DEFAULTS", "Builder", "Config", "IImpalaBuilder", "IImpalaConfig"]
