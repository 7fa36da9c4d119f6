"""tenantctl asks one other endpoint before believing an UNAUTHENTICATED (a coordinator that has not
applied a token created a moment ago), and only one: a token refused twice is refused."""

from __future__ import annotations

import io

from controlplane.cli.tenantctl import run
from tests.unit.test_tenantctl_cli import write_config
from tests.unit.test_tenantctl_fake import ADMIN_TOKEN, FakeGroup


def _whoami(group: FakeGroup, tmp_path) -> tuple[int, str, str]:
    cfg = write_config(tmp_path / "c.yaml", [{"name": "local", "endpoints": group.addresses, "insecure": True,
                                              "token": ADMIN_TOKEN}], "local")
    out, err = io.StringIO(), io.StringIO()
    code = run(["--config", str(cfg), "whoami"], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_lagging_first_endpoint_is_not_believed(tmp_path) -> None:
    g = FakeGroup(3)
    try:
        g.endpoints[0].lagging = True
        code, out, err = _whoami(g, tmp_path)
        assert code == 0 and f"endpoint {g.addresses[1]}" in out, err
        assert g.store.calls.count("WhoAmI") == 2
    finally:
        g.stop()


def test_one_retry_only(tmp_path) -> None:
    g = FakeGroup(3)
    try:
        g.endpoints[0].lagging = g.endpoints[1].lagging = True
        code, _, err = _whoami(g, tmp_path)
        assert code == 1 and f"{g.addresses[1]}: UNAUTHENTICATED" in err
        assert g.store.calls.count("WhoAmI") == 2  # the third endpoint is not asked
    finally:
        g.stop()
