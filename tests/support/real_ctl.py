"""The real ``tenantctl`` (``controlplane.cli.tenantctl.run``) against a real in-process coordinator
(one Raft member with its lease, control loop and gRPC API on 127.0.0.1), for the CLI tests that
must see what the server really does (issue 18's acceptance: never only against the fake).

    with real_ctl(tmp_path) as rc:
        code, out, err = rc.ctl("apply", "-f", str(path))
        rc.admin.tenants.GetTenant(...)          # stubs with the admin token
        rc.ctl_as(token, "get", "deployments")   # another principal
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from controlplane.cli.tenantctl import run
from controlplane.coordinator import Coordinator
from tests.unit.test_api_server import Group, started_group


class RealCtl(Group):
    """A :class:`tests.unit.test_api_server.Group` plus a tenantctl configuration pointing at it."""

    def __init__(self, coordinator: Coordinator, admin_token: str, base: Path) -> None:
        super().__init__(coordinator, admin_token)
        self.base = base
        self.config = self.write_config(admin_token, "tenantctl.yaml")

    def write_config(self, token: str, name: str) -> Path:
        path = self.base / name
        data = {"apiVersion": "controlplane.io/v1", "kind": "Config", "current-context": "local",
                "contexts": [{"name": "local", "endpoints": [self.endpoint], "insecure": True, "token": token}]}
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        path.chmod(0o600)
        return path

    def ctl(self, *args: str, stdin: str = "", config: Path | None = None) -> tuple[int, str, str]:
        """Run tenantctl in-process; returns (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        code = run(["--config", str(config or self.config), *args], out=out, err=err, stdin=io.StringIO(stdin))
        return code, out.getvalue(), err.getvalue()

    def ctl_as(self, token: str, *args: str, stdin: str = "") -> tuple[int, str, str]:
        return self.ctl(*args, stdin=stdin, config=self.write_config(token, f"tenantctl-{token[3:15]}.yaml"))


@contextmanager
def real_ctl(base: Path, **overrides: Any) -> Iterator[RealCtl]:
    """A started in-process coordinator under ``base`` (``overrides`` go into its configuration)."""
    with started_group(base, lambda co, token: RealCtl(co, token, base), **overrides) as g:
        yield g
