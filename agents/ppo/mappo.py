"""MAPPO (Yu et al., 2022) for the command line (`--agent=mappo`): IPPO with a centralised
critic on the env's global state (agents/ppo/multi_agent.py); nothing of PPO is copied."""

from trellis.agents.ppo.multi_agent import IPPOBuilder, MAPPOConfig

# The names agents/registry.py looks up.
Builder = IPPOBuilder
Config = MAPPOConfig

__all__ = ["Builder", "Config", "IPPOBuilder", "MAPPOConfig"]
