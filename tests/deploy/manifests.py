"""Rendering deploy/ with ``kubectl kustomize`` and the property checks the deploy tests apply.

Each ``*_problems`` function returns a list of one-line problems (empty = fine), so a test can
both assert that the shipped manifests pass and feed it a mutated object to prove it would fail.
"""

from __future__ import annotations

import functools
import math
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = sorted(p.parent.relative_to(DEPLOY).as_posix() for p in (DEPLOY / "overlays").rglob("kustomization.yaml"))
BASES = sorted(p.parent.relative_to(DEPLOY).as_posix() for p in (DEPLOY / "base").rglob("kustomization.yaml"))
K8S_VERSION = "1.37.0"
CONTROLPLANE_IMAGE = "registry.example.com/controlplane"
POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")
ZONE_KEY = "topology.kubernetes.io/zone"

Obj = dict[str, Any]


def kubectl() -> str | None:
    return shutil.which("kubectl")


@functools.cache
def render(folder: str) -> tuple[Obj, ...]:
    """The objects ``kubectl kustomize deploy/<folder>`` prints (cached: rendering is the slow part)."""
    exe = kubectl()
    assert exe is not None
    out = subprocess.run([exe, "kustomize", str(DEPLOY / folder)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, f"kubectl kustomize deploy/{folder}: {out.stderr.strip()}"
    return tuple(o for o in yaml.safe_load_all(out.stdout) if o)


def ident(o: Obj) -> str:
    return f"{o['kind']}/{o['metadata'].get('namespace', '-')}/{o['metadata']['name']}"


def of_kind(objs: Iterable[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Iterable[Obj], kind: str, name: str = "") -> Obj:
    """The one object of ``kind`` called ``name`` (or ``name`` plus kustomize's hash suffix); with no
    name, the only object of that kind."""
    found = [o for o in objs if o["kind"] == kind
             and (not name or re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"]))]
    assert len(found) == 1, f"expected one {kind} {name!r}, got {[ident(o) for o in found]}"
    return found[0]


def pod_spec(o: Obj) -> Obj | None:
    if o["kind"] in POD_KINDS:
        return o["spec"]["template"]["spec"]
    if o["kind"] == "CronJob":
        return o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if o["kind"] == "Pod":
        return o["spec"]
    return None


def containers(spec: Obj) -> Iterator[Obj]:
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def is_controlplane(c: Obj) -> bool:
    return c["image"].split(":")[0].split("@")[0] == CONTROLPLANE_IMAGE


def config_map_file(objs: Iterable[Obj], name_prefix: str, key: str) -> str:
    return one(objs, "ConfigMap", name_prefix)["data"][key]


# --- properties -----------------------------------------------------------------------------------


def quorum(n: int) -> int:
    return n // 2 + 1


def spread_problems(sts: Obj) -> list[str]:
    """One pod per zone: a hard zone spread with skew 1 that selects the StatefulSet's own pods."""
    spec = sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    hard = [c for c in spec.get("topologySpreadConstraints", [])
            if c.get("topologyKey") == ZONE_KEY and c.get("whenUnsatisfiable") == "DoNotSchedule"
            and c.get("maxSkew") == 1
            and all(labels.get(k) == v for k, v in c.get("labelSelector", {}).get("matchLabels", {}).items())
            and c.get("labelSelector", {}).get("matchLabels")]
    return [] if hard else [f"{ident(sts)}: no zone spread (maxSkew 1, DoNotSchedule on {ZONE_KEY}) over its pods"]


def pdb_problems(sts: Obj, pdbs: Iterable[Obj], zones: int) -> list[str]:
    """A PodDisruptionBudget over the group's pods that never lets a voluntary disruption go below a
    quorum, and enough zones that losing the biggest one keeps a quorum too."""
    n = sts["spec"].get("replicas", 1)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    mine = [p for p in pdbs if p["metadata"].get("namespace") == sts["metadata"].get("namespace")
            and p["spec"].get("selector", {}).get("matchLabels")
            and all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
    if len(mine) != 1:
        return [f"{ident(sts)}: expected one PodDisruptionBudget over its pods, got {len(mine)}"]
    spec = mine[0]["spec"]
    if "maxUnavailable" in spec:
        allowed = _count(spec["maxUnavailable"], n, up=True)
    else:
        allowed = n - _count(spec.get("minAvailable", 0), n, up=True)
    out = []
    if n - allowed < quorum(n):
        out.append(f"{ident(mine[0])}: lets {allowed} of {n} go, leaving {n - allowed} < quorum {quorum(n)}")
    if allowed < 1:
        out.append(f"{ident(mine[0])}: allows no disruption at all (node drains would block forever)")
    if n - math.ceil(n / max(zones, 1)) < quorum(n):
        out.append(f"{ident(sts)}: {n} members over {zones} zones: losing a zone loses the quorum")
    return out


def _count(value: int | str, n: int, *, up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = n * int(value[:-1]) / 100
        return math.ceil(exact) if up else math.floor(exact)
    return int(value)


def rbac_problems(objs: Iterable[Obj]) -> list[str]:
    out = []
    for o in objs:
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            out.append(f"{ident(o)}: cluster-wide RBAC (use a Role per managed namespace)")
        if o["kind"] not in ("Role", "ClusterRole"):
            continue
        for i, rule in enumerate(o.get("rules", [])):
            for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                if any("*" in v for v in rule.get(field, [])):
                    out.append(f"{ident(o)}: rules[{i}].{field} has a wildcard: {rule[field]}")
            if not rule.get("resources"):
                out.append(f"{ident(o)}: rules[{i}] names no resources")
    return out


def role_grants(role: Obj) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples."""
    return {(g, r, v) for rule in role.get("rules", []) for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}


def nonroot_problems(objs: Iterable[Obj]) -> list[str]:
    out = []
    for o in objs:
        spec = pod_spec(o)
        if spec is None:
            continue
        pod_sc = spec.get("securityContext", {})
        for c in containers(spec):
            sc = {**pod_sc, **c.get("securityContext", {})}
            where = f"{ident(o)} container {c['name']}"
            if sc.get("runAsNonRoot") is not True:
                out.append(f"{where}: runAsNonRoot is not true")
            if sc.get("runAsUser", 1) == 0 or sc.get("runAsGroup", 1) == 0:
                out.append(f"{where}: runs as uid/gid 0")
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation", True) is not False:
                out.append(f"{where}: may escalate privileges")
            if "ALL" not in c.get("securityContext", {}).get("capabilities", {}).get("drop", []):
                out.append(f"{where}: does not drop all capabilities")
            if is_controlplane(c) and c.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
                out.append(f"{where}: root filesystem is writable")
            if is_controlplane(c) and not ({"requests", "limits"} <= set(c.get("resources", {}))):
                out.append(f"{where}: no resource requests and limits")
    return out


def secret_refs(spec: Obj) -> set[str]:
    names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for v in spec.get("volumes", []):
        for src in v.get("projected", {}).get("sources", []):
            if "secret" in src:
                names.add(src["secret"]["name"])
    names |= {s["name"] for s in spec.get("imagePullSecrets", [])}
    for c in containers(spec):
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                  if "secretKeyRef" in e.get("valueFrom", {})}
        names |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
    return names


def secret_problems(objs: Iterable[Obj]) -> list[str]:
    """Every Secret is used by a pod of its namespace, and every Secret a pod uses exists."""
    objs = list(objs)
    secrets = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in of_kind(objs, "Secret")}
    used: set[tuple[str | None, str]] = set()
    out = []
    for o in objs:
        spec = pod_spec(o)
        if spec is None:
            continue
        for name in secret_refs(spec):
            ref = (o["metadata"].get("namespace"), name)
            used.add(ref)
            if ref not in secrets:
                out.append(f"{ident(o)}: uses Secret {name!r}, which is not in the output")
    out += [f"Secret/{ns}/{name}: not used by any pod" for ns, name in sorted(secrets - used, key=str)]
    return out


def mounted_file(spec: Obj, container: Obj, path: str, objs: Iterable[Obj]) -> tuple[Obj, str] | None:
    """(the ConfigMap or Secret, key) that provides the file at ``path`` in ``container``."""
    for m in container.get("volumeMounts", []):
        base = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(base) or "subPath" in m:
            continue
        key = path[len(base):]
        vol = next(v for v in spec["volumes"] if v["name"] == m["name"])
        if "secret" in vol:
            src = one(objs, "Secret", vol["secret"]["secretName"])
            return (src, key) if key in src.get("data", {}) or key in src.get("stringData", {}) else None
        if "configMap" in vol:
            src = one(objs, "ConfigMap", vol["configMap"]["name"])
            return (src, key) if key in src.get("data", {}) else None
    return None


def command_of(container: Obj) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def exec_probes(container: Obj) -> list[list[str]]:
    return [container[p]["exec"]["command"] for p in ("startupProbe", "readinessProbe", "livenessProbe")
            if "exec" in container.get(p, {})]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def container_port(container: Obj, name: str) -> int:
    [port] = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == name]
    return port


def service_port(svc: Obj, name: str) -> tuple[int, int | str]:
    [p] = [p for p in svc["spec"]["ports"] if p.get("name") == name]
    return p["port"], p.get("targetPort", p["port"])


def shell(cmd: list[str]) -> str:
    return shlex.join(cmd)


def load_yaml(text: str) -> Obj:
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data
