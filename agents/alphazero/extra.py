"""What AlphaZero needs beyond the base install: pyproject's `search` extra (mctx, pgx).

Without it the agent's package still imports, so that the command lines parse its settings
(`--agent=alphazero --help` lists them); its `Builder` is then `missing_search_extra`'s
stand-in, whose construction fails in one line naming the extra (run.py: exit 2).
"""

from __future__ import annotations

from typing import Any, NoReturn

SEARCH_PACKAGES = ("mctx", "pgx")
INSTALL = "pip install -e '.[search]'"


def missing_search_extra(package: str, agent: str = "alphazero") -> type:
    """A stand-in for the builder of `agent` (AlphaZero's, MuZero's) where `package` (one of
    SEARCH_PACKAGES) is not installed: building it raises ValueError, one line naming the
    extra."""

    class SearchExtraMissing:
        def __init__(self, config: Any) -> NoReturn:
            del config
            raise ValueError(f"--agent={agent} needs the search extra ({package} is not "
                             f"installed): {INSTALL}")

    return SearchExtraMissing
