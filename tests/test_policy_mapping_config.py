"""The multi-agent agents (ippo, mappo, iimpala) take their policy-mapping settings and check
from one base, agents/common/multi_agent.py's `PolicyMappingConfig`."""

from __future__ import annotations

import pytest

from trellis.agents.common.multi_agent import PolicyMappingConfig
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.multi_agent import IImpalaConfig
from trellis.agents.ppo.config import PPOConfig
from trellis.agents.ppo.multi_agent import IPPOConfig, MAPPOConfig
from trellis.builders.contract.config import ConfigError, settings
from trellis.builders.contract.policy_mapping import PolicyMapping

CONFIGS = [IPPOConfig, MAPPOConfig, IImpalaConfig]
SINGLE_AGENT = {IPPOConfig: PPOConfig, MAPPOConfig: PPOConfig, IImpalaConfig: ImpalaConfig}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_the_mapping_settings_come_from_the_shared_base(config):
    assert issubclass(config, PolicyMappingConfig)
    shared = settings(PolicyMappingConfig)
    assert [s.name for s in shared] == ["policy_mapping", "policies"]
    # The single agent's settings, then the mapping's (the order --help lists them in).
    single = settings(SINGLE_AGENT[config])
    names = [s.name for s in settings(config)]
    assert names[:len(single)] == [s.name for s in single]
    assert settings(config)[len(single):len(single) + len(shared)] == shared


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_the_mapping_is_checked_and_parsed_alike(config):
    with pytest.raises(ConfigError, match=r"policy_mapping must be a mapping onto the declared "
                                          r"policies \(policy_mapping names policy 'x', which "
                                          r"is not one of the policies \['y'\]"):
        config(policy_mapping="agent_*=x", policies="y")
    chosen = config(policy_mapping="adversary_*=adv,agent_*=good", policies="adv,good")
    assert chosen.mapping == PolicyMapping.parse("adversary_*=adv,agent_*=good", "adv,good")
    assert config().mapping == PolicyMapping.parse("shared")
