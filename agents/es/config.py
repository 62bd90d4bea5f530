"""Evolution strategies configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import Config, setting
from trellis.builders.contract.hparams import CONSTANT, LEARNING_RATE_SCHEDULES

# Our OpenAI-ES (agents/es/losses.py), then evosax 0.3's strategies by their names there: the
# anakin platform runs any of them; the host platforms too, since a worker replays the same
# ask and tell from the broadcast fitnesses (docs/es.md).
OPEN_ES = "open_es"
EVOSAX_STRATEGIES = {"cma_es": "CMA_ES", "sep_cma_es": "Sep_CMA_ES", "snes": "SNES",
                     "xnes": "xNES", "pgpe": "PGPE", "evosax_open_es": "Open_ES"}
STRATEGIES = (OPEN_ES, *EVOSAX_STRATEGIES)
# The strategies that step their mean with Adam: those with a learning rate to schedule.
WITH_LEARNING_RATE = (OPEN_ES, "evosax_open_es")

# The defaults that differ on a platform (run.py applies them). On anakin a compiled call is one
# generation, whose size population_size and episodes_per_member set; the host checks the stop
# rule and logs after each, so builders/experiments/es_run.py refuses other values.
PLATFORM_DEFAULTS = {"anakin": {"updates_per_call": 1}}


@dataclasses.dataclass(frozen=True)
class ESConfig(Config):
    """Hyper-parameters of OpenAI-ES (Salimans et al., 2017) and of the evosax strategies.

    Fitness is the undiscounted return of whole episodes, maximised. The defaults solve
    CartPole-v1 (docs/es.md).
    """

    strategy: str = setting(
        OPEN_ES, "the search: open_es (ours: antithetic sampling, centred ranks, weight decay, "
        "Adam) or one of evosax's (needs the es extra)", choices=STRATEGIES)
    population_size: int = setting(
        256, "perturbed policies evaluated per generation (even: antithetic pairs)", ge=2)
    sigma: float = setting(0.1, "standard deviation of the parameter noise", gt=0)
    learning_rate: float = setting(0.03, "Adam's step size on the gradient estimate", gt=0)
    learning_rate_schedule: str = setting(
        CONSTANT, "the learning rate's schedule: constant, or linear (falling to 0 at the end "
        "of the env-step budget, --total_env_steps); open_es and evosax_open_es only",
        choices=LEARNING_RATE_SCHEDULES)
    weight_decay: float = setting(
        0.005, "L2 coefficient added to the gradient estimate (the paper's 0.005)", ge=0)
    adam_eps: float = setting(1e-8, "Adam's epsilon (denominator stability)", gt=0)
    episodes_per_member: int = setting(
        1, "episodes each member plays per generation; its fitness is their mean return", ge=1)
    hidden_sizes: tuple[int, ...] = setting(
        (32,), "widths of the policy MLP's hidden layers, comma-separated", ge=1)

    def check(self) -> None:
        if self.population_size % 2:
            raise self.invalid("population_size", "even (members come in antithetic pairs)")
        if self.learning_rate_schedule != CONSTANT and not self.has_learning_rate:
            raise self.invalid("learning_rate_schedule",
                               f"constant with --strategy={self.strategy}, which has no "
                               f"learning rate ({', '.join(WITH_LEARNING_RATE)} have one)")

    @property
    def has_learning_rate(self) -> bool:
        """Whether the strategy steps its mean with Adam at `learning_rate`."""
        return self.strategy in WITH_LEARNING_RATE
