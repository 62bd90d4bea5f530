"""IPPO (de Witt et al., 2020) for the command line (`--agent=ippo`): PPO for each policy of a
multi-agent env (agents/ppo/multi_agent.py); nothing of PPO is copied."""

from trellis.agents.ppo.multi_agent import IPPOBuilder, IPPOConfig

# The names agents/registry.py looks up.
Builder = IPPOBuilder
Config = IPPOConfig

__all__ = ["Builder", "Config", "IPPOBuilder", "IPPOConfig"]
