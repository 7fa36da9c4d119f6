import os

import controlplane  # noqa: F401  (first: keeps gRPC fork support off, see controlplane/__init__.py)
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis: deterministic in CI (derandomize), a bit more thorough locally.
settings.register_profile("ci", max_examples=100, derandomize=True, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"


def long_mode() -> bool:
    """Slow-marked tests run a short version by default and the full one with CP_SLOW=1."""
    return bool(os.environ.get("CP_SLOW"))


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.fail(f"{TRACES} is missing: the tests read the shared traces in place")
    return TRACES
