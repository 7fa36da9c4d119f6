"""The adapter's configuration file: what loads, what is refused (naming file and field), and the
``controlplane adapter`` command's refusal of a bad configuration (one line on stderr, exit code 2)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError as PydanticValidationError

from adapters.config import AdapterConfig, build_backend, load_adapter_config
from adapters.service import RecordingBackend
from adapters.simulated import SimulatedBackend
from controlplane.config import ConfigError

REPO = Path(__file__).resolve().parents[2]

SIMULATED: dict[str, Any] = {
    "cluster_id": "eu-west-1a",
    "listen": "127.0.0.1:7001",
    "state_dir": "state",
    "observe_interval_ms": 100,
    "ring_s": 60,
    "backend": "simulated",
    "simulated": {
        "seed": 7,
        "deployments": [
            {"deployment": "chat", "model": "llama3-8b-h100", "cold_start_ms": 5_000, "warm_start_ms": 500,
             "load": [{"at_s": 0, "rps": 2}, {"at_s": 30, "rps": 40}, {"at_s": 60, "rps": 0}], "max_queue_ms": 10_000},
            {"deployment": "code", "model": "llama3-70b-h100x4"},
        ],
    },
}
RECORDING: dict[str, Any] = {
    "cluster_id": "c1", "listen": "0.0.0.0:7002", "state_dir": "/var/lib/adapter", "backend": "recording",
    "recording": {"path": "records/c1.jsonl"}, "auth_token_file": "adapter.token",
    "tls": {"cert_file": "pki/server.pem", "key_file": "pki/server-key.pem", "client_ca_file": "pki/ca.pem"},
    "fence_public_key_files": ["fence/fence.pub.pem"],
}
"""Off loopback: a token, mutual TLS and the fence public key (all three are required there)."""
TOKEN = "s3cret-adapter-token-0123456789"


def write(tmp_path: Path, data: Any, name: str = "adapter.yaml") -> Path:
    from controlplane.fencing import make_fence_key
    from controlplane.tls import make_dev_pki

    path = tmp_path / name
    (tmp_path / "adapter.token").write_text(TOKEN + "\n")
    if not (tmp_path / "pki" / "ca.pem").exists():
        make_dev_pki(tmp_path / "pki")
    if not (tmp_path / "fence" / "fence.pub.pem").exists():
        make_fence_key(tmp_path / "fence")
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


def refused(tmp_path: Path, data: Any, where: str = "") -> ConfigError:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_adapter_config(path)
    assert str(err.value).startswith(f"{path}{where}: ")
    assert "\n" not in str(err.value)
    assert err.value.file == str(path)
    return err.value


def test_a_simulated_configuration_loads(tmp_path: Path) -> None:
    cfg = load_adapter_config(write(tmp_path, SIMULATED))
    assert (cfg.cluster_id, cfg.listen, cfg.observe_interval_ms, cfg.ring_s, cfg.backend) == (
        "eu-west-1a", "127.0.0.1:7001", 100, 60.0, "simulated")
    assert cfg.simulated is not None and cfg.simulated.seed == 7
    chat, code = cfg.simulated.deployments
    assert [s.rps for s in chat.load] == [2, 40, 0]
    assert (chat.profile().cold_start_ms, chat.profile().warm_start_ms) == (5_000, 500)
    assert code.profile().cold_start_ms == 90_000  # the model profile's own
    assert (code.prompt_tokens, code.output_tokens, code.max_queue_ms) == (512, 128, 30_000)


def test_defaults(tmp_path: Path) -> None:
    data = {k: v for k, v in SIMULATED.items() if k not in ("observe_interval_ms", "ring_s")}
    cfg = load_adapter_config(write(tmp_path, data))
    assert (cfg.observe_interval_ms, cfg.ring_s) == (250, 120.0)


def test_relative_paths_resolve_against_the_configuration_folder(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "etc" / "adapter"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sim = load_adapter_config(write(folder, SIMULATED))
    assert sim.state_dir == folder / "state"
    rec = load_adapter_config(write(folder, RECORDING, "rec.yaml"))
    assert rec.recording is not None and rec.recording.path == folder / "records" / "c1.jsonl"
    assert rec.auth_token_file == folder / "adapter.token" and rec.auth_token() == TOKEN
    assert rec.state_dir == Path("/var/lib/adapter")  # absolute paths stay as they are
    absolute = copy.deepcopy(RECORDING)
    absolute["recording"]["path"] = str(tmp_path / "abs.jsonl")
    assert load_adapter_config(write(folder, absolute, "abs.yaml")).recording.path == tmp_path / "abs.jsonl"


def test_build_backend(tmp_path: Path) -> None:
    sim = build_backend(load_adapter_config(write(tmp_path, SIMULATED)))
    assert isinstance(sim, SimulatedBackend) and sim.cluster_id == "eu-west-1a"
    assert sorted(sim.statistics()) == ["chat", "code"]
    rec = build_backend(load_adapter_config(write(tmp_path, RECORDING, "rec.yaml")))
    assert isinstance(rec, RecordingBackend)
    assert (tmp_path / "records").is_dir()  # the record's folder is created


def mutated(base: dict[str, Any], change) -> dict[str, Any]:
    data = copy.deepcopy(base)
    change(data)
    return data


@pytest.mark.parametrize("change, field, problem", [
    (lambda d: d.update(backend="docker"), "backend", "'kubernetes', 'simulated' or 'recording'"),
    (lambda d: d.pop("simulated"), "simulated", "required when backend is 'simulated'"),
    (lambda d: d.update(backend="recording"), "recording", "required when backend is 'recording'"),
    (lambda d: d["simulated"]["deployments"][1].update(model="gpt-9"), "simulated.deployments[1].model",
     "unknown model profile 'gpt-9'"),
    (lambda d: d["simulated"]["deployments"][0]["load"][2].update(at_s=30), "simulated.deployments[0].load",
     "strictly increasing"),
    (lambda d: d["simulated"]["deployments"][0].update(load=[]), "simulated.deployments[0].load", "at least one step"),
    (lambda d: d["simulated"]["deployments"][1].update(deployment="chat"), "simulated",
     "deployments: duplicate deployment 'chat'"),
    (lambda d: d.update(listen="localhost"), "listen", "not 'host:port'"),
    (lambda d: d.update(listen="127.0.0.1:99999"), "listen", "port"),
    (lambda d: d.update(colour="blue"), "colour", "unknown field"),
    (lambda d: d["simulated"].update(speed=2), "simulated.speed", "unknown field"),
    (lambda d: d.update(cluster_id="Not An Id"), "cluster_id", "not a valid id"),
    (lambda d: d.update(observe_interval_ms=0), "observe_interval_ms", "greater than or equal to 10"),
    (lambda d: d.pop("state_dir"), "state_dir", "required"),
    (lambda d: d["simulated"]["deployments"][0]["load"][0].update(rps=-1), "simulated.deployments[0].load[0].rps",
     "greater than or equal to 0"),
])
def test_errors_name_the_field(tmp_path: Path, change, field: str, problem: str) -> None:
    err = refused(tmp_path, mutated(SIMULATED, change))
    assert err.field == field
    assert str(err).startswith(f"{tmp_path / 'adapter.yaml'}: {field}: ")
    assert problem in str(err)
    assert "\n" not in str(err)


def test_invalid_yaml_empty_file_and_wrong_top_level(tmp_path: Path) -> None:
    err = refused(tmp_path, "cluster_id: c1\nlisten: [unclosed\nring_s: 5\n", where=":3")  # where PyYAML finds the problem
    assert "not valid YAML" in str(err)
    assert "top level must be a mapping" in str(refused(tmp_path, "- a\n- b\n"))
    assert "cluster_id: required" in str(refused(tmp_path, ""))  # an empty file is an empty mapping


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match="cannot read the configuration") as err:
        load_adapter_config(path)
    assert str(err.value).startswith(f"{path}: ")


def test_the_model_is_frozen(tmp_path: Path) -> None:
    cfg = load_adapter_config(write(tmp_path, SIMULATED))
    with pytest.raises(PydanticValidationError):
        cfg.listen = "0.0.0.0:1"  # type: ignore[misc]
    assert isinstance(cfg, AdapterConfig)


# --- authentication and TLS ----------------------------------------------------------------------


def test_no_token_is_allowed_on_loopback_only(tmp_path: Path) -> None:
    for listen in ("127.0.0.1:7001", "localhost:7001", "127.0.0.2:7001"):
        cfg = load_adapter_config(write(tmp_path, dict(SIMULATED, listen=listen)))
        assert cfg.auth_token_file is None and cfg.auth_token() is None and cfg.tls_pair() is None
    for listen in ("0.0.0.0:7001", "10.0.0.5:7001", "adapter.example.com:7001"):
        err = refused(tmp_path, dict(SIMULATED, listen=listen))
        assert err.field == "auth_token_file"
        assert f"auth_token_file: required because listen {listen} is not a loopback address" in str(err)


@pytest.mark.parametrize("content, problem", [
    ("", "is empty"),
    ("   \n", "is empty"),
    ("short", "at least 16 characters"),
    ("two words but long enough", "one word of printable ASCII"),
])
def test_a_bad_token_file_is_refused_naming_the_field_never_the_token(tmp_path: Path, content: str, problem: str) -> None:
    path = write(tmp_path, RECORDING)
    (tmp_path / "adapter.token").write_text(content)
    with pytest.raises(ConfigError) as err:
        load_adapter_config(path)
    assert str(err.value).startswith(f"{path}: auth_token_file: ") and problem in str(err.value)
    assert err.value.field == "auth_token_file"
    if content.strip():
        assert content.strip() not in str(err.value)


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, dict(RECORDING, auth_token_file="nowhere.token"))
    with pytest.raises(ConfigError, match="auth_token_file: cannot read") as err:
        load_adapter_config(path)
    assert err.value.field == "auth_token_file"


def test_tls_files_resolve_relative_and_must_be_pem(tmp_path: Path) -> None:
    from controlplane.tls import make_dev_pki

    make_dev_pki(tmp_path / "pki")
    ca = {"client_ca_file": "pki/ca.pem"}
    cfg = load_adapter_config(write(tmp_path, dict(RECORDING, tls={"cert_file": "pki/server.pem",
                                                                    "key_file": "pki/server-key.pem", **ca})))
    assert cfg.tls is not None and cfg.tls.cert_file == tmp_path / "pki" / "server.pem"
    cert, key = cfg.tls_pair()
    assert cert.startswith(b"-----BEGIN CERTIFICATE") and key.startswith(b"-----BEGIN PRIVATE KEY")
    swapped = write(tmp_path, dict(RECORDING, tls={"cert_file": "pki/server-key.pem", "key_file": "pki/server-key.pem", **ca}))
    with pytest.raises(ConfigError, match="tls.cert_file: .* is not a PEM certificate") as err:
        load_adapter_config(swapped)
    assert err.value.field == "tls.cert_file"
    missing = write(tmp_path, dict(RECORDING, tls={"cert_file": "pki/server.pem", "key_file": "pki/nope.pem", **ca}))
    with pytest.raises(ConfigError, match="tls.key_file: cannot read") as err:
        load_adapter_config(missing)
    err = refused(tmp_path, dict(RECORDING, tls={"cert_file": "pki/server.pem", **ca}))
    assert err.field == "tls.key_file" and "required" in str(err)


def test_off_loopback_mutual_tls_and_fence_keys_are_required(tmp_path: Path) -> None:
    cfg = load_adapter_config(write(tmp_path, RECORDING))
    assert cfg.client_ca() is not None and cfg.fence_verifier() is not None
    assert cfg.tls is not None and cfg.tls.client_ca_file == tmp_path / "pki" / "ca.pem"
    assert cfg.fence_public_key_files == [tmp_path / "fence" / "fence.pub.pem"]
    no_tls = {k: v for k, v in RECORDING.items() if k != "tls"}
    err = refused(tmp_path, no_tls)
    assert err.field == "tls" and "not a loopback address" in str(err) and "mutual TLS" in str(err)
    err = refused(tmp_path, dict(RECORDING, tls={"cert_file": "pki/server.pem", "key_file": "pki/server-key.pem"}))
    assert err.field == "tls.client_ca_file" and "only coordinator certificates" in str(err)
    err = refused(tmp_path, dict(RECORDING, fence_public_key_files=[]))
    assert err.field == "fence_public_key_files" and "signed by a coordinator's fence key" in str(err)
    err = refused(tmp_path, dict(RECORDING, fence_public_key_files=["fence/fence.pub.pem", "pki/ca.pem"]))
    assert err.field == "fence_public_key_files[1]" and "not a PEM public key" in str(err)
    err = refused(tmp_path, dict(RECORDING, fence_public_key_files=["fence/fence-key.pem"]))
    assert err.field == "fence_public_key_files[0]" and "not a PEM public key" in str(err)
    err = refused(tmp_path, dict(RECORDING, tls=dict(RECORDING["tls"], client_ca_file="pki/server-key.pem")))
    assert err.field == "tls.client_ca_file" and "not a PEM certificate" in str(err)
    # Loopback: each layer may be left out (development); the adapter then warns once per layer.
    dev = load_adapter_config(write(tmp_path, dict(SIMULATED, listen="127.0.0.1:7001")))
    assert dev.client_ca() is None and dev.fence_verifier() is None


# --- the CLI ------------------------------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "adapter", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("controlplane: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_refuses_a_bad_configuration_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, mutated(SIMULATED, lambda d: d["simulated"]["deployments"][1].update(model="gpt-9")),
                 "bad.yaml")
    assert_one_line_refusal(run_cli("--config", str(path), cwd=tmp_path), "bad.yaml: simulated.deployments[1].model:")
    assert not (tmp_path / "state").exists()  # refused before anything started


def test_cli_refuses_config_mixed_with_cluster(tmp_path: Path) -> None:
    path = write(tmp_path, SIMULATED)
    assert_one_line_refusal(run_cli("--config", str(path), "--cluster", "c1", cwd=tmp_path), "--cluster", "--config")


def test_cli_refuses_auth_token_file_mixed_with_config(tmp_path: Path) -> None:
    path = write(tmp_path, SIMULATED)
    assert_one_line_refusal(run_cli("--config", str(path), "--auth-token-file", "t", cwd=tmp_path),
                            "--auth-token-file", "--config")


def test_cli_legacy_flags_need_a_token_off_loopback(tmp_path: Path) -> None:
    flags = ["--cluster", "c1", "--state-dir", str(tmp_path / "s"), "--record", str(tmp_path / "r.jsonl")]
    assert_one_line_refusal(run_cli(*flags, "--listen", "0.0.0.0:7001", cwd=tmp_path),
                            "--auth-token-file: required because listen 0.0.0.0:7001")
    (tmp_path / "weak.token").write_text("weak")
    assert_one_line_refusal(run_cli(*flags, "--listen", "127.0.0.1:7001", "--auth-token-file", str(tmp_path / "weak.token"),
                                    cwd=tmp_path), "--auth-token-file:", "at least 16 characters")
    (tmp_path / "good.token").write_text("g" * 32)  # off loopback the flags cannot give mutual TLS: --config
    assert_one_line_refusal(run_cli(*flags, "--listen", "0.0.0.0:7001", "--auth-token-file", str(tmp_path / "good.token"),
                                    cwd=tmp_path), "--listen: tls: required because listen 0.0.0.0:7001")
    assert not (tmp_path / "s").exists()


def test_cli_reports_invalid_yaml_on_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster_id: c1\nlisten: [unclosed\n", "bad.yaml")
    assert_one_line_refusal(run_cli("--config", str(path), cwd=tmp_path), "bad.yaml:", "not valid YAML")


def test_a_kubernetes_section_is_validated_by_the_backend_s_own_model(tmp_path: Path) -> None:
    """The kubernetes section is checked by ``adapters.kubernetes.KubernetesConfig`` at load time, and
    its errors carry the ``kubernetes.`` prefix; a valid one builds without touching a cluster."""
    from adapters.config import load_adapter_config
    from controlplane.config import ConfigError

    good = {"cluster_id": "c1", "listen": "127.0.0.1:7001", "state_dir": "s", "backend": "kubernetes",
            "kubernetes": {"workloads": [{"deployment": "chat", "namespace": "serving", "kind": "Deployment",
                                          "name": "chat-vllm", "engine": "vllm", "port": 8000}]}}
    path = tmp_path / "k8s.yaml"
    path.write_text(yaml.safe_dump(good))
    assert load_adapter_config(path).backend == "kubernetes"
    bad = dict(good, kubernetes={"workloads": [dict(good["kubernetes"]["workloads"][0], kind="DaemonSet")]})
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError) as err:
        load_adapter_config(path)
    assert str(err.value).startswith(f"{path}: kubernetes.workloads[0].kind: ")
