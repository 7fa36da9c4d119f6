"""The node-local model cache: pre-fetch model weights onto a GPU node, and hand them to an engine.

Runs in the engine image (``vllm/vllm-openai``: Python and ``huggingface_hub`` are there), mounted
from the ConfigMap ``model-cache-fetch``. Two commands:

``daemon`` (the DaemonSet ``model-cache``, one pod per node labelled
``controlplane.io/model-cache=enabled``): writes the ConfigMap ``model-cache-<node>`` (label
``controlplane.io/model-cache=node``, owned by this pod so it goes when the pod or node goes) with no
models, then downloads every model of ``models.txt`` (``<name> <repo> [<revision>]`` a line; the
name is the controlplane deployment's ``model``) into ``<root>/<name>`` (via ``<name>.partial``,
renamed when complete) and lists each completed one in the ConfigMap's ``models``. Then it checks
the list again every ``--every-s`` seconds (new models; completed ones are never fetched twice).
The cluster adapter reads those ConfigMaps (``adapters/model_cache.py``): a model every cache node
lists is a ``cached`` start there.

``engine`` (an engine pod's init container): ``--out`` becomes a link to ``<root>/<name>`` when the
node holds the model complete (the ``cached`` tier: a local read), else the weights are downloaded
into ``--out`` (the ``cold`` tier). The engine loads ``--out`` either way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
COMPLETE = ".complete"
API = "https://kubernetes.default.svc"
SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LABEL = "controlplane.io/model-cache"

Download = Callable[[str, str | None, Path], None]


def parse_models(text: str) -> list[tuple[str, str, str | None]]:
    """``models.txt``: ``<name> <repo> [<revision>]`` a line, ``#`` comments; raises ValueError naming
    the line of a bad one."""
    out: list[tuple[str, str, str | None]] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3) or not NAME.match(parts[0]) or parts[0] in seen:
            raise ValueError(f"models.txt:{n}: expected '<name> <repo> [<revision>]' with a new name "
                             f"of [A-Za-z0-9._-], got {raw.strip()!r}")
        seen.add(parts[0])
        out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else None))
    return out


def hf_download(repo: str, revision: str | None, into: Path) -> None:
    from huggingface_hub import snapshot_download  # in the engine image

    snapshot_download(repo_id=repo, revision=revision, local_dir=str(into))


def complete(root: Path, name: str) -> bool:
    return (root / name / COMPLETE).is_file()


def fetch(root: Path, name: str, repo: str, revision: str | None, download: Download) -> None:
    """Weights of ``name`` into ``root/name``, atomically: downloaded into ``name.partial`` (resumed
    after a restart), marked complete, then renamed."""
    if complete(root, name):
        return
    partial = root / f"{name}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    download(repo, revision, partial)
    (partial / COMPLETE).write_text(json.dumps({"repo": repo, "revision": revision}) + "\n")
    os.replace(partial, root / name)


def for_engine(root: Path, name: str, repo: str, revision: str | None, out: Path, download: Download) -> str:
    """``out`` -> the node's copy when complete (returns ``cached``), else downloaded there (``cold``)."""
    if out.is_symlink() or out.exists():
        return "present"
    if complete(root, name):
        out.symlink_to(root / name, target_is_directory=True)
        return "cached"
    out.mkdir(parents=True)
    download(repo, revision, out)
    return "cold"


def configmap(node: str, pod: str, pod_uid: str, namespace: str, models: list[str]) -> dict[str, object]:
    """The per-node ConfigMap the adapter reads."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": f"model-cache-{node}", "namespace": namespace, "labels": {LABEL: "node"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}],
        },
        "data": {"node": node, "models": "".join(f"{m}\n" for m in sorted(models))},
    }


def publish(body: dict[str, object]) -> None:
    """Create or replace the ConfigMap through the API server with the pod's ServiceAccount."""
    meta = body["metadata"]
    assert isinstance(meta, dict)
    base = f"{API}/api/v1/namespaces/{meta['namespace']}/configmaps"
    ctx = ssl.create_default_context(cafile=str(SA / "ca.crt"))
    headers = {"Authorization": f"Bearer {(SA / 'token').read_text().strip()}", "Content-Type": "application/json"}

    def call(method: str, url: str, data: dict[str, object] | None = None) -> dict[str, object]:
        req = urllib.request.Request(url, method=method, headers=headers,
                                     data=None if data is None else json.dumps(data).encode())
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return json.loads(resp.read())

    try:
        current = call("GET", f"{base}/{meta['name']}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        call("POST", base, body)
        return
    current_meta = current["metadata"]
    assert isinstance(current_meta, dict)
    meta["resourceVersion"] = current_meta["resourceVersion"]
    call("PUT", f"{base}/{meta['name']}", body)


def daemon(args: argparse.Namespace, download: Download = hf_download,
           publish_fn: Callable[[dict[str, object]], None] = publish, rounds: int | None = None) -> None:
    """Publish what the node holds (first before any download, so the node counts at once), fetch
    what is missing, publishing after each model that completes; every ``--every-s`` again.
    ``rounds``: stop after that many (tests); None: forever."""
    root = Path(args.root)
    env = os.environ
    node, pod, uid, ns = env["NODE_NAME"], env["POD_NAME"], env["POD_UID"], env["POD_NAMESPACE"]
    published: list[str] | None = None

    def update(models: list[tuple[str, str, str | None]]) -> None:
        nonlocal published
        held = [m for m, _, _ in models if complete(root, m)]
        if held != published:
            publish_fn(configmap(node, pod, uid, ns, held))
            published = held
            print(f"model-cache: {node} holds {held}", flush=True)

    done = 0
    while rounds is None or done < rounds:
        models = parse_models(Path(args.models).read_text())
        update(models)
        for name, repo, revision in models:
            try:
                fetch(root, name, repo, revision, download)
            except Exception as exc:  # noqa: BLE001 - one bad model must not stop the others
                print(f"model-cache: {name} ({repo}): {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            update(models)
        done += 1
        if rounds is None or done < rounds:
            time.sleep(args.every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fetch.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("daemon")
    d.add_argument("--models", required=True)
    d.add_argument("--root", required=True)
    d.add_argument("--every-s", type=float, default=300.0)
    e = sub.add_parser("engine")
    e.add_argument("--models", required=True)
    e.add_argument("--root", required=True)
    e.add_argument("--name", required=True)
    e.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "daemon":
            daemon(args)
            return 0
        by_name = {m[0]: m for m in parse_models(Path(args.models).read_text())}
        if args.name not in by_name:
            print(f"fetch.py: --name: {args.name!r} is not in {args.models}", file=sys.stderr)
            return 2
        _, repo, revision = by_name[args.name]
        tier = for_engine(Path(args.root), args.name, repo, revision, Path(args.out), hf_download)
        print(f"model-cache: {args.name}: {tier}", flush=True)
        return 0
    except (ValueError, OSError) as exc:
        print(f"fetch.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
