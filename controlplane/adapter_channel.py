"""The coordinator's side of the adapter channel's security, as configured (``CoordinatorConfig``):

* ``adapter_tls`` (:class:`AdapterTlsConfig`): mutual TLS to the adapters. ``cert_file``/``key_file``
  are this coordinator's client certificate, which must carry the URI SAN
  ``controlplane://coordinator/<node_id>`` (adapters accept commands only from such certificates,
  ``adapters/identity.py``; :func:`controlplane.tls.issue_coordinator_cert` makes one for
  development), ``ca_file`` the CA that signed the adapters' server certificates. Required as soon
  as one configured adapter address is not a loopback address.
* ``fence_key_file``: the coordinators' Ed25519 fence key (PEM, PKCS#8), the same file on every
  coordinator; the lease holder signs ``(epoch, holder)`` with it and adapters verify with the
  public half (``controlplane/fencing.py``, docs/lease.md "Signed fencing tokens").

Kept apart from ``controlplane/config.py`` so that file stays about the Raft group.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from controlplane.files import file_problem


class AdapterTlsConfig(BaseModel):
    """Mutual TLS to the adapters (PEM files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path
    """The CA that signed the adapters' server certificates."""
    cert_file: Path
    """This coordinator's client certificate (URI SAN ``controlplane://coordinator/<node_id>``)."""
    key_file: Path
    server_name: str | None = None
    """Name to verify in the adapters' certificates instead of the host in their address."""

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _file(cls, value: Path) -> Path:
        problem = file_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def client(self):
        """As :class:`adapters.client.AdapterTls`."""
        from adapters.client import AdapterTls

        return AdapterTls(self.ca_file, self.cert_file, self.key_file, self.server_name)


def fence_key_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable fence private key, or None."""
    from controlplane.fencing import FenceKeyError, load_private_key

    try:
        load_private_key(path)
    except FenceKeyError as exc:
        return str(exc)
    return None


def adapter_channel_problems(cfg) -> list[tuple[str, str]]:
    """A configured adapter address that is not loopback needs ``adapter_tls``."""
    from controlplane.config import is_loopback_address

    if cfg.adapter_tls is not None:
        return []
    for i, cl in enumerate(cfg.clusters):
        if cl.adapter_address and not is_loopback_address(cl.adapter_address):
            return [("adapter_tls", f"required: clusters[{i}].adapter_address {cl.adapter_address!r} is not a loopback "
                                    "address, and adapter channels are mutual TLS (ca_file, cert_file, key_file)")]
    return []
