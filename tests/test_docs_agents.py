"""docs/your_own_agent.md shows what runs: each block marked `<!-- from: FILE -->` there is in
that test file as it stands (which trains it), and each message marked
`<!-- message: NAME -->` is what Trellis says."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

from tests.test_agent_kinds import (
    CARTPOLE,
    A2CBuilder,
    A2CConfig,
    TinyESBuilder,
    TinyESConfig,
)
from trellis.builders.contract.agent import EPISODES, Capabilities
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.session import UnsupportedError, run_experiment
from trellis.envs import make_env_factory

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "your_own_agent.md"
_QUOTED = re.compile(r"<!-- from: (\S+) -->\n```\w*\n(.*?)```", re.S)
_MESSAGE = re.compile(r"<!-- message: (\S+) -->\n```text\n(.*?)\n```", re.S)


def quoted_blocks(doc: pathlib.Path) -> list[tuple[str, str]]:
    """(file, code) of each block of `doc` marked as quoted from a file."""
    return _QUOTED.findall(doc.read_text())


def messages(doc: pathlib.Path) -> dict[str, str]:
    return dict(_MESSAGE.findall(doc.read_text()))


def appears_in(code: str, source: str) -> bool:
    """Whether `code` is in `source` line for line, at some indentation (a function's body is
    quoted dedented)."""
    return any(textwrap.indent(code, " " * level) in source for level in (0, 4, 8))


def test_quoted_code_is_the_tests_code():
    blocks = quoted_blocks(DOC)
    assert len(blocks) >= 10  # One kind's agent, config and run at least, for three kinds.
    stale = [code.splitlines()[0] for path, code in blocks
             if not appears_in(code, (REPO / path).read_text())]
    assert stale == [], f"blocks of {DOC.name} no longer in their test file: {stale}"


def _refusal(builder: object, tmp_path: pathlib.Path) -> str:
    """What `run_experiment` says of `builder` on anakin, having started nothing."""
    with pytest.raises(UnsupportedError) as error:
        run_experiment(builder, make_env_factory(CARTPOLE), ExperimentConfig(), str(tmp_path),
                       platform="anakin", quiet=True)
    assert not (tmp_path / "metrics.jsonl").exists()
    return str(error.value)


class HalfSearch:
    """Claims to learn from episodes (a population search) with only what every agent that
    acts has."""

    capabilities = Capabilities(EPISODES, anakin=True)
    config = TinyESConfig()
    make_networks = TinyESBuilder.make_networks
    make_training = TinyESBuilder.make_training
    make_policy = TinyESBuilder.make_policy
    initial_state = TinyESBuilder.initial_state


def test_the_refusal_of_a_builder_lacking_its_kinds_members_is_the_docs(tmp_path):
    assert _refusal(HalfSearch(), tmp_path) == messages(DOC)["lacking"]


def test_the_refusal_of_a_schedule_without_hparams_is_the_docs(tmp_path):
    builder = A2CBuilder(A2CConfig(learning_rate_schedule="linear"), hparams=False)
    assert _refusal(builder, tmp_path) == messages(DOC)["hparams"]
