"""Files a user hands the control plane, fuzzed: the coordinator configuration, the adapter
configuration, the tenantctl configuration, simulator scenarios and Azure trace CSVs.

Inputs: a valid document with one to three fields broken (removed, replaced by any YAML value, an
unknown key added, a list or mapping where a scalar belongs, NaN and infinities), the valid
document's text broken at the byte level (truncated, invalid UTF-8, NUL, random bytes, a tab,
deep nesting, an alias bomb), and arbitrary bytes. Whatever the input, the loader returns a valid
object or raises its typed error (``ConfigError``, ``ScenarioError``, ``TraceError``: all
``PermanentError``) with a one-line message naming the file; never another exception.

What a loader accepts must also be usable: a scenario's generated workload is bounded (finite
values, a bounded number of requests: the simulator would otherwise never finish) and a trace's
requests are in time order with counts in range.

Bounded and derandomized for CI; ``CP_SLOW=1`` explores more with fresh seeds.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.config import load_adapter_config
from controlplane.cli.tenantctl import config as tenantctl_config
from controlplane.config import ConfigError, load_config
from controlplane.domain.errors import PermanentError
from controlplane.sim import scenario as sim_scenario
from controlplane.sim.workload import MAX_TOKENS, TraceError, read_azure_trace
from tests.conftest import long_mode
from tests.fuzz.docpaths import paths as doc_paths
from tests.raft.test_config import GOOD as COORDINATOR
from tests.unit.test_adapter_config import SIMULATED as ADAPTER
from tests.unit.test_adapter_config import TOKEN
from tests.unit.test_tenantctl_config import BASE as TENANTCTL

_SLOW = long_mode()
FUZZ = settings(max_examples=300 if _SLOW else 30, deadline=None, derandomize=not _SLOW, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
DEMO = Path(sim_scenario.__file__).parent / "scenarios" / "demo.yaml"

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e308]),
                    st.floats(), st.text(max_size=20),
                    st.sampled_from(["", "127.0.0.1:0", "host:99999", "a" * 300, "../x", "x\n", "~", "yes", "0x10"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


@st.composite
def near_valid(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = doc_paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        op = draw(st.sampled_from(["delete", "replace", "replace", "unknown"]))
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(VALUES)
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(VALUES)
    return doc


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode("utf-8")


@st.composite
def broken_text(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    text = _dump(base)
    op = draw(st.sampled_from(["truncate", "utf8", "nul", "splice", "tab", "deep", "bomb", "bytes", "bom", "huge"]))
    at = draw(st.integers(0, len(text)))
    if op == "truncate":
        return text[:at]
    if op == "utf8":
        return text[:at] + b"\xff\xfe\xc3" + text[at:]
    if op == "nul":
        return text[:at] + b"\x00" + text[at:]
    if op == "splice":
        return text[:at] + draw(st.binary(min_size=1, max_size=16)) + text[at:]
    if op == "tab":
        return text.replace(b"  ", b"\t", 1)
    if op == "deep":
        depth = draw(st.sampled_from([50, 300]))  # deeper: test_deeply_nested_yaml_is_a_typed_error
        return text + b"x_deep: " + b"[" * depth + b"]" * depth + b"\n"
    if op == "bomb":
        lines = [b"a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]".encode()
            for i in range(1, 9)]
        return b"\n".join(lines) + b"\n" + text
    if op == "bom":
        return "\ufeff".encode() + text
    if op == "huge":
        return text + b"# " + b"x" * (2 << 20) + b"\n"
    return draw(st.binary(max_size=200))


def documents(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(near_valid(base).map(_dump), near_valid(base).map(_dump), broken_text(base),
                     VALUES.map(_dump))


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cp-fuzz-files-") as d:
        root = Path(d)
        (root / "adapter.token").write_text(TOKEN + "\n", encoding="utf-8")
        yield root


def load_and_check(path: Path, data: bytes, loader: Callable[[Path], Any], error: type[Exception],
                   one_line: bool = True) -> Any:
    path.write_bytes(data)
    try:
        return loader(path)
    except error as exc:
        assert isinstance(exc, PermanentError)
        message = str(exc)
        assert message.strip() and (not one_line or "\n" not in message), f"not a one-line message: {message!r}"
        assert str(path) in message, f"the message does not name the file: {message!r}"
        return None


@FUZZ
@given(data=documents({**COORDINATOR, "data_dir": "data"}))
def test_coordinator_configs_load_or_raise_config_error(workdir: Path, data: bytes) -> None:
    load_and_check(workdir / "coordinator.yaml", data, lambda p: load_config(p, env={}), ConfigError)


@FUZZ
@given(data=documents(ADAPTER))
def test_adapter_configs_load_or_raise_config_error(workdir: Path, data: bytes) -> None:
    load_and_check(workdir / "adapter.yaml", data, load_adapter_config, ConfigError)


@FUZZ
@given(data=documents(TENANTCTL))
def test_tenantctl_configs_load_or_raise_config_error(workdir: Path, data: bytes) -> None:
    load_and_check(workdir / "tenantctl.yaml", data, tenantctl_config.load, ConfigError)


@pytest.mark.parametrize("loader", ["coordinator", "adapter", "tenantctl"])
def test_deeply_nested_yaml_and_invalid_utf8_are_typed_errors(workdir: Path, loader: str) -> None:
    """PyYAML recurses per nesting level: 5,000 levels used to escape as RecursionError, and a file
    that is not UTF-8 as UnicodeDecodeError (both are ConfigError now)."""
    load = {"coordinator": lambda p: load_config(p, env={}), "adapter": load_adapter_config,
            "tenantctl": tenantctl_config.load}[loader]
    cases = [("utf8", b"node_id: \xff\xfe\n"), ("big", b"# " + b"x" * (2 << 20) + b"\n")]
    if loader == "coordinator":  # one reader for all three: the slow case once
        cases.append(("deep", b"a: " + b"[" * 1_500 + b"]" * 1_500 + b"\n"))
    for name, data in cases:
        path = workdir / f"{loader}-{name}.yaml"
        path.write_bytes(data)
        with pytest.raises(ConfigError) as err:
            load(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value), err.value


def bounded_workloads(sc: Any) -> None:
    """What an accepted scenario asks of the simulator is finite and bounded."""
    for d in sc.spec.deployments:
        w = d.workload
        assert math.isfinite(w.offset_s) and 0 <= w.offset_s <= 30 * 86_400, w
        g = getattr(w, "generator", None)
        if g is None:
            continue
        values = {k: v for k, v in g.model_dump().items() if k != "burst_group"}  # a name, not a number
        assert all(math.isfinite(v) for v in values.values()), values
        assert values["duration_s"] > 0 and values["diurnal_period_s"] > 0 and values["prompt_mean"] > 0, values
        assert values["burst_every_s"] == 0 or values["burst_every_s"] >= 1, values
        peak = values["base_rps"] * (1 + abs(values["diurnal_amplitude"])) * max(1.0, values["burst_factor"])
        assert peak * values["duration_s"] <= 50_000_000, values


@settings(FUZZ)
@given(data=documents(yaml.safe_load(DEMO.read_text(encoding="utf-8"))))
def test_scenarios_load_or_raise_scenario_error_and_accepted_ones_are_bounded(workdir: Path, data: bytes) -> None:
    # One line per problem (a scenario reports all of them), each naming the file.
    sc = load_and_check(workdir / "scenario.yaml", data, sim_scenario.load_scenario, sim_scenario.ScenarioError,
                        one_line=False)
    if sc is not None:
        bounded_workloads(sc)


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROW = st.tuples(
    st.one_of(st.sampled_from(["2023-11-16 18:17:03.9799600", "2023-11-16 18:17:04", "2023-11-16 18:17:03.",
                               "2023-13-16 18:17:03.1", "0001-01-01 00:00:00.1", "9999-12-31 23:59:59.9999999",
                               "2023-11-16 18:17:03.1e5", "", "2023-11-16T18:17:03", "2023-11-16 18:17:03." + "9" * 5000]),
              st.text(max_size=30)),
    st.one_of(st.integers(-5, 10_000).map(str), st.sampled_from(["", "1.5", "1e3", str(MAX_TOKENS + 1), "9" * 5000]),
              st.text(max_size=5)),
    st.one_of(st.integers(-5, 10_000).map(str), st.sampled_from(["", "0", "-0", "+7"])),
)


@st.composite
def traces(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from([HEADER, HEADER, HEADER, "timestamp,a,b", "", HEADER + ",extra", "\ufeff" + HEADER]))
    rows = draw(st.lists(ROW, max_size=6))
    sep = draw(st.sampled_from([",", ",", ";", ",,"]))
    text = "\n".join([header] + [sep.join(r) for r in rows]) + "\n"
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\x00", b"\xff", b'"', b"\r", b"\n\n", b'"unterminated'])) + data[at:]
    return data


@FUZZ
@given(data=traces(), rate_scale=st.sampled_from([1.0, 0.5, 60.0, 1e-300, 1e300]),
       limit_s=st.sampled_from([None, 0.0, 1.0, 1e300]))
def test_traces_read_or_raise_trace_error_and_requests_are_ordered(workdir: Path, data: bytes, rate_scale: float,
                                                                  limit_s: float | None) -> None:
    path = workdir / "trace.csv"
    # a header with a quoted newline used to be echoed into the message as is
    reqs = load_and_check(path, data, lambda p: read_azure_trace(p, rate_scale=rate_scale, limit_s=limit_s), TraceError,
                          one_line=True)
    if reqs is None:
        return
    arrivals = [r.arrival_ms for r in reqs]
    assert arrivals == sorted(arrivals) and all(a >= 0 for a in arrivals), arrivals
    assert all(1 <= r.prompt_tokens <= MAX_TOKENS and 1 <= r.output_tokens <= MAX_TOKENS for r in reqs)


@pytest.mark.parametrize("rate_scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_trace_rate_scale_that_is_no_positive_finite_number_is_a_trace_error(workdir: Path, rate_scale: float) -> None:
    path = workdir / "ok.csv"
    path.write_text(f"{HEADER}\n2023-11-16 18:17:03.1,1,2\n2023-11-16 18:17:04.1,1,2\n", encoding="utf-8")
    with pytest.raises(TraceError, match="rate_scale"):
        read_azure_trace(path, rate_scale=rate_scale)
