"""What a coordinator imports before its Raft member starts, and what it never imports: checked in a
fresh interpreter through ``sys.modules`` (no timing: start-up time is measured by
``controlplane bench stability --fresh-starts``, docs/reliability.md "Fresh start on a busy machine").

Before Raft starts, a coordinator (``controlplane coordinator`` -> ``controlplane.member.launch``)
needs the configuration model, the Raft node and the lease guard, nothing of the API, the control
loop, the adapter clients, metrics or logging (imported while the first election timer runs).
Never: the Kubernetes client and the adapter server (adapters' side), matplotlib (plots), the
simulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

BEFORE_RAFT = ("controlplane.cli.main", "controlplane.config", "controlplane.member")
NOT_BEFORE_RAFT = ("structlog", "rich", "grpc", "prometheus_client", "google.protobuf", "controlplane.coordinator",
                   "controlplane.api.server", "controlplane.runtime.loop", "adapters.client", "numpy")
NEVER = ("kubernetes", "matplotlib", "adapters.service", "adapters.kube", "controlplane.sim", "controlplane.cli.demo",
         "controlplane.cli.demo_load", "controlplane.cli.demo_plot", "controlplane.cli.demo_view", "controlplane.cli.demo_watch")


def loaded_after(imports: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    code = (f"import importlib, json, sys\nfor m in {list(imports)!r}: importlib.import_module(m)\n"
            f"print(json.dumps([w for w in {list(watched)!r} if any(n == w or n.startswith(w + '.') for n in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout)


def test_nothing_but_raft_and_the_configuration_before_the_member_starts() -> None:
    assert loaded_after(BEFORE_RAFT, NOT_BEFORE_RAFT + NEVER) == []


@pytest.mark.parametrize("entry", ["controlplane.coordinator", "controlplane.cli.main"])
def test_a_whole_coordinator_never_imports_the_adapter_side_plots_or_the_simulator(entry: str) -> None:
    assert loaded_after((entry, "controlplane.member"), NEVER) == []
