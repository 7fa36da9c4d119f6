"""Per-tenant deployment names in the API (docs/security.md "Names", docs/api.md "Deployment names").

Inside the group a deployment created through the API has the qualified id ``"<tenant>/<name>"``
(:func:`~controlplane.domain.ids.qualified_id`); the API speaks tenant-local names: ``metadata.name`` is
the name within ``spec.tenant``, and a request naming a deployment gives

* a tenant principal: the bare name (its own tenant implied), or ``<its tenant>/<name>``; another
  tenant's qualified name reads exactly as a free name (``NOT_FOUND`` naming what was sent);
* an admin: ``<tenant>/<name>``, or a bare name together with the request's ``tenant`` field where it
  has one (Watch); a bare name alone is ``INVALID_ARGUMENT`` saying how to qualify it.

A legacy id (one label, from state written before names were per tenant, or a scenario file) is the
deployment of its tenant with that name: :func:`resolve` maps ``(tenant, name)`` to it when no
qualified id of that pair exists, and never to another tenant's legacy id.
"""

from __future__ import annotations

from controlplane.api import convert as cv
from controlplane.api.auth import Principal
from controlplane.domain.errors import clip
from controlplane.domain.ids import QUALIFIER, DeploymentId, deployment_id_problem, id_problem, qualified_id
from controlplane.domain.state import ControlState

__all__ = ["refuse_qualified", "request_ref", "resolve"]


def refuse_qualified(value: str, field: str = "metadata.name") -> None:
    """INVALID_ARGUMENT when ``value`` (a deployment's ``metadata.name``) is qualified: it is the name
    within ``spec.tenant``. Everything else about it is checked with the rest of the message."""
    if QUALIFIER in value:
        raise cv.invalid(field, f"{clip(value)} is qualified: {field} is the name within the tenant "
                                "(one label, e.g. 'chat'); the tenant goes in spec.tenant")


def request_ref(p: Principal, value: str, field: str, tenant: str = "") -> tuple[str, str]:
    """``(tenant, name)`` of the deployment a request names in ``field`` (``tenant``: the request's own
    tenant field, if it has one); raises :class:`~controlplane.api.convert.InvalidArgument` naming
    ``field``. Visibility is the caller's business (:meth:`Principal.sees_tenant`)."""
    if not value:
        raise cv.invalid(field, "required")
    if QUALIFIER in value:
        problem = deployment_id_problem(value)
        if problem:
            raise cv.invalid(field, problem)
        owner, _, name = value.partition(QUALIFIER)
        if tenant and owner != tenant:
            raise cv.invalid(field, f"{clip(value)} names tenant {clip(owner)}, but tenant is {clip(tenant)}")
        return owner, name
    problem = id_problem(value)
    if problem:
        raise cv.invalid(field, problem)
    if not p.is_admin:
        return p.tenant, value
    if tenant:
        return tenant, value
    raise cv.invalid(field, f"deployment names are per tenant: an admin names one as '<tenant>/<name>' "
                            f"(e.g. 'alpha/{value}')")


def resolve(state: ControlState, tenant: str, name: str) -> DeploymentId:
    """The id of ``tenant``'s deployment ``name``: its qualified id, or its legacy id (``name`` itself,
    owned by ``tenant``) when only that exists; the qualified id of a free name (what a create makes)."""
    qualified = qualified_id(tenant, name)
    if qualified in state.deployments:
        return qualified
    legacy = state.deployments.get(DeploymentId(name))
    if legacy is not None and legacy.tenant == tenant:
        return DeploymentId(name)
    return qualified
