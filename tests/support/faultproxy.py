"""The fault-injecting TCP proxies moved into the package (``controlplane/chaos/proxy.py``) so that
``controlplane bench chaos`` can run from an installed package; this module re-exports them for the
existing tests."""

from controlplane.chaos.proxy import (  # noqa: F401
    ENV_VAR,
    LOOPBACK,
    MAX_NODES,
    LinkProxy,
    Mode,
    Partitioner,
    ProxiedTCPNode,
    ProxyLimits,
    ProxyStats,
    TCPNode,
    dialer,
    free_loopback_ports,
    mapping_from_env,
    proxied_nodes,
)
