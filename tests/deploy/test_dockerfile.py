"""deploy/Dockerfile cannot be built here (no container engine), so what can be checked is checked:
pinned bases, a numeric non-root user that matches the manifests, the entrypoint, and that every
command the manifests run in the image (container args, exec probes) is a real CLI command."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from controlplane.cli.main import _parser, main
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    REPO,
    containers,
    exec_probes,
    is_controlplane,
    kubectl,
    pod_spec,
    render,
)

DOCKERFILE = DEPLOY / "Dockerfile"
PINNED_TAG = re.compile(r"^\d+\.\d+\.\d+[-a-z0-9.]*$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        buf += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if line.rstrip().endswith("\\"):
            continue
        if buf:
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def stages(text: str) -> list[dict[str, object]]:
    args: dict[str, str] = {}
    found: list[dict[str, object]] = []
    for op, rest in instructions(text):
        if op == "ARG" and not found:
            name, _, default = rest.partition("=")
            args[name] = default
        elif op == "FROM":
            ref, *alias = rest.split()
            ref = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], ref)
            found.append({"from": ref, "name": alias[-1] if alias else None, "ops": []})
        elif found:
            found[-1]["ops"].append((op, rest))  # type: ignore[union-attr]
    return found


def pinned_problems(text: str) -> list[str]:
    st = stages(text)
    names = {s["name"] for s in st if s["name"]}
    out = []
    for s in st:
        ref = str(s["from"])
        if ref in names:
            continue
        tag = ref.split("@")[0].rpartition(":")[2] if ":" in ref.split("@")[0].rpartition("/")[2] else ""
        if not DIGEST.search(ref) and not PINNED_TAG.match(tag):
            out.append(f"FROM {ref}: pin an exact version tag (x.y.z) or a digest")
    return out


def final_user(text: str) -> str | None:
    users = [rest for op, rest in stages(text)[-1]["ops"] if op == "USER"]  # type: ignore[union-attr]
    return users[-1] if users else None


def test_every_base_image_is_pinned() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert len(stages(text)) == 2
    assert pinned_problems(text) == []
    assert pinned_problems("FROM python:3.11-slim-bookworm\n") and pinned_problems("FROM python:latest\n")
    assert pinned_problems("FROM python\n")
    assert pinned_problems("FROM python:3.11-slim@sha256:" + "a" * 64 + "\n") == []


def test_the_image_runs_as_a_numeric_non_root_user_the_manifests_agree_with() -> None:
    user = final_user(DOCKERFILE.read_text(encoding="utf-8"))
    assert user is not None and re.fullmatch(r"\d+:\d+", user)
    uid, gid = (int(x) for x in user.split(":"))
    assert uid > 0 and gid > 0
    assert final_user("FROM a:1.2.3\nUSER 0\n") == "0"
    assert final_user("FROM a:1.2.3\nUSER app\nFROM b:1.2.3\n") is None
    if kubectl() is None:
        pytest.skip("kubectl is not on PATH")
    for folder in OVERLAYS:
        for o in render(folder):
            spec = pod_spec(o)
            if spec is None:
                continue
            for c in containers(spec):
                if is_controlplane(c):
                    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
                    assert (sc["runAsUser"], sc["runAsGroup"]) == (uid, gid), f"{folder} {o['metadata']['name']}"


def test_the_entrypoint_is_the_controlplane_console_script() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    [entry] = [rest for op, rest in stages(text)[-1]["ops"] if op == "ENTRYPOINT"]  # type: ignore[union-attr]
    assert json.loads(entry) == ["controlplane"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["controlplane"] == "controlplane.cli.main:main"


def test_the_build_copies_what_pyproject_packages_and_the_dockerignore_lets_it_through() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    copied = {w for rest in (r for op, r in stages(text)[0]["ops"] if op == "COPY") for w in rest.split()[:-1]}  # type: ignore[union-attr]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", project["project"]["readme"]} == copied
    for path in copied:
        assert (REPO / path).exists(), path
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert ignore[ignore.index("**")] == "**"
    assert {f"!{p}/**" for p in packages} | {"!pyproject.toml", f"!{project['project']['readme']}"} <= set(ignore)


def in_image_commands() -> list[list[str]]:
    """Every command line the manifests run in the controlplane image, ENTRYPOINT included."""
    found = []
    for folder in OVERLAYS:
        for o in render(folder):
            spec = pod_spec(o)
            if spec is None:
                continue
            for c in containers(spec):
                if not is_controlplane(c):
                    continue
                assert "command" not in c, "keep the image's ENTRYPOINT"
                found.append(["controlplane", *c["args"]])
                found.extend(exec_probes(c))
    return found


def test_every_command_the_manifests_run_is_a_real_cli_command(capsys: pytest.CaptureFixture[str]) -> None:
    if kubectl() is None:
        pytest.skip("kubectl is not on PATH")
    commands = in_image_commands()
    assert {tuple(c[:2]) for c in commands} == {("controlplane", "coordinator"), ("controlplane", "adapter"),
                                                 ("controlplane", "health"), ("controlplane", "gpu-agent"),
                                                 ("controlplane", "mii-meter")}
    for cmd in {tuple(c) for c in commands}:
        assert cmd[0] == "controlplane"
        args = _parser().parse_args(list(cmd[1:]))  # every flag exists and parses
        assert args.command == cmd[1]
        with pytest.raises(SystemExit) as exc:
            main([cmd[1], "--help"])
        assert exc.value.code == 0
        assert f"usage: controlplane {cmd[1]}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # and an unknown flag would have been caught
        _parser().parse_args(["health", "--config", "x", "--no-such-flag"])
    assert exc.value.code == 2
