"""Status conditions in the API (docs/api.md "Conditions"): the live facts they need, and their messages.

The conditions themselves are computed by :mod:`controlplane.core.conditions` when an object is
read. Two inputs are not in the replicated state:

* the adapter links, known only to the lease holder's control loop. The holder reads them
  locally; any other coordinator asks the holder once per read (one forwarded ``ListClusters``
  with the caller's token and a short deadline, :data:`FORWARD_DEADLINE_S`, for a get or a list
  alike) and takes the holder's ``AdapterConnected`` conditions. No holder that answers:
  ``AdapterConnected=Unknown``;
* the message of the decision that set a deployment's desired count (who preempted it, the quota
  numbers), kept in the coordinator's event log; when the log no longer holds it the condition
  says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.api.v1 import api_pb2, api_pb2_grpc
from controlplane.core.conditions import ADAPTER_CONNECTED, FALSE, TRUE, AdapterLink, Condition
from controlplane.domain.ids import ClusterId
from controlplane.domain.state import ControlState

FORWARD_DEADLINE_S = 0.5
"""Deadline of the one call a read forwards to the lease holder for its adapter links."""


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What cluster conditions need beyond the replicated state."""

    configured: Mapping[str, str] = field(default_factory=dict)
    """Cluster -> the adapter address the coordinators' configuration gives it."""
    links: Mapping[ClusterId, AdapterLink] | None = None
    """The lease holder's view of the adapters (None: no lease holder could be asked)."""
    now_ms: int = 0


NO_FACTS = ClusterFacts()


def to_proto(conditions: Iterable[Condition]) -> list[api_pb2.Condition]:
    return [api_pb2.Condition(type=c.type, status=c.status, reason=c.reason, message=c.message,
                              last_transition_ms=c.last_transition_ms) for c in conditions]


def links_of_holder(holder: Any) -> dict[ClusterId, AdapterLink] | None:
    """The lease holder's own links (``HolderView.adapter_links``), or None when it has none."""
    got = holder.adapter_links() if holder is not None else None
    if got is None:
        return None
    return {ClusterId(cid): AdapterLink(bool(ok), int(since)) for cid, (ok, since) in got.items()}


def links_of_reply(items: Sequence[api_pb2.Cluster]) -> dict[ClusterId, AdapterLink]:
    """The adapter links a lease holder's ``ListClusters`` answer carries in its conditions."""
    out: dict[ClusterId, AdapterLink] = {}
    for cl in items:
        for c in cl.status.conditions:
            if c.type != ADAPTER_CONNECTED:
                continue
            if c.status == TRUE:
                out[ClusterId(cl.metadata.name)] = AdapterLink(True, c.last_transition_ms)
            elif c.status == FALSE and c.reason == "AdapterDisconnected":
                out[ClusterId(cl.metadata.name)] = AdapterLink(False, c.last_transition_ms)
    return out


def cluster_facts(cfg: Any, holds_lease: bool, holder: Any, forward: Callable[..., Any], context: Any,
                  now_ms: int) -> ClusterFacts:
    """The facts of one read: the holder's links (local, or one forwarded ListClusters)."""
    configured = {s.id: s.adapter_address for s in cfg.clusters if s.adapter_address}
    if holds_lease:
        return ClusterFacts(configured, links_of_holder(holder), now_ms)
    reply = forward(context, lambda ch, md: api_pb2_grpc.ClustersStub(ch).ListClusters(
        api_pb2.ListRequest(), timeout=FORWARD_DEADLINE_S, metadata=md))
    links = links_of_reply(reply.items) if reply is not None else None
    return ClusterFacts(configured, links, now_ms)


def decision_message(events: Any, state: ControlState, deployment_id: str) -> str:
    """The message of the decision that set the deployment's desired count, if the event log
    still holds it ("" otherwise)."""
    desired = state.desired.get(deployment_id)
    if events is None or desired is None:
        return ""
    latest = events.decisions(deployment_id, 1)
    if latest and latest[-1].reason == desired.reason and latest[-1].at_ms == desired.at_ms:
        return str(latest[-1].message)
    return ""
