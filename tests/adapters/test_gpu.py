"""GpuMonitor against a fake NvmlApi that raises real pynvml.NVMLError(code) instances and returns
real pynvml ctypes structs, plus one run against the real pynvml module on this machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from adapters.gpu import GpuMemory, GpuMonitor, GpuProcess, MigDeviceMemory

GiB = 1024**3


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def test_nvml_error_construction_is_what_we_rely_on() -> None:
    e = err(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert type(e) is pynvml.NVMLError_GpuIsLost and e.value == 15
    assert isinstance(err(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), pynvml.NVMLError_LibraryNotFound)


def mem_v1(total: int, used: int) -> Any:
    return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)


def mem_v2(total: int, reserved: int, used: int) -> Any:
    return pynvml.c_nvmlMemory_v2_t(
        version=pynvml.nvmlMemory_v2, total=total, reserved=reserved, used=used,
        free=total - reserved - used,
    )


def proc(pid: int, used: int | None) -> Any:
    return pynvml.nvmlFriendlyObject(
        {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
    )


@dataclass
class FakeDev:
    uuid: str
    name: str
    total: int
    reserved: int
    used: int
    procs: list[Any] = field(default_factory=list)
    mig_mode: int | None = None  # None: MIG not supported
    migs: dict[int, FakeDev] = field(default_factory=dict)
    max_migs: int = 0
    fail: dict[str, int] = field(default_factory=dict)  # method name -> NVML error code


class FakeNvml:
    """Implements adapters.gpu.NvmlApi with pynvml's names, structs and errors."""

    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, devices: list[FakeDev], *, init_error: int | None = None, v2: bool = True) -> None:
        self.devices = devices
        self.init_error = init_error
        self.v2 = v2
        self.calls: list[str] = []
        self.inited = 0

    def _check(self, name: str, dev: FakeDev | None = None) -> None:
        self.calls.append(name)
        if name not in ("nvmlInit",) and self.inited <= 0:
            raise err(pynvml.NVML_ERROR_UNINITIALIZED)
        if dev is not None and name in dev.fail:
            raise err(dev.fail[name])

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise err(self.init_error)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.inited -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDev:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[index]
        self._check("nvmlDeviceGetHandleByIndex", dev)
        return dev

    def nvmlDeviceGetUUID(self, h: FakeDev) -> str:
        self._check("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeDev) -> str:
        self._check("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeDev, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", h)
        if version:
            if not self.v2:
                raise err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            assert version == pynvml.nvmlMemory_v2
            return mem_v2(h.total, h.reserved, h.used)
        return mem_v1(h.total, h.reserved + h.used)  # v1 used = reserved + allocated

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeDev) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return list(h.procs)

    def nvmlDeviceGetMigMode(self, h: FakeDev) -> list[int]:
        self._check("nvmlDeviceGetMigMode", h)
        if h.mig_mode is None:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeDev) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return h.max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeDev, index: int) -> FakeDev:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index not in h.migs:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return h.migs[index]


def two_gpus() -> list[FakeDev]:
    return [
        FakeDev("GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * GiB, 512 * 2**20, 60 * GiB,
                procs=[proc(1234, 60 * GiB - 512 * 2**20)]),
        FakeDev("GPU-bbbb", "NVIDIA H100 80GB HBM3", 80 * GiB, 512 * 2**20, 0),
    ]


def test_two_gpus_happy_path_exact_numbers() -> None:
    api = FakeNvml(two_gpus())
    mon = GpuMonitor(api)
    assert mon.start() is True and mon.available
    got = mon.read()
    assert got == (
        GpuMemory(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", total=80 * GiB, used=60 * GiB,
                  free=80 * GiB - 512 * 2**20 - 60 * GiB, reserved=512 * 2**20,
                  processes=(GpuProcess(1234, 60 * GiB - 512 * 2**20),)),
        GpuMemory(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", total=80 * GiB, used=0,
                  free=80 * GiB - 512 * 2**20, reserved=512 * 2**20, processes=()),
    )
    assert all(g.ok and not g.lost and not g.mig_enabled for g in got)
    mon.close()


def test_v2_not_supported_falls_back_to_v1_and_sticks() -> None:
    api = FakeNvml(two_gpus(), v2=False)
    mon = GpuMonitor(api)
    mon.start()
    g0, g1 = mon.read()
    assert (g0.total, g0.used, g0.free, g0.reserved) == (80 * GiB, 60 * GiB + 512 * 2**20,
                                                         80 * GiB - 60 * GiB - 512 * 2**20, None)
    assert (g1.used, g1.reserved) == (512 * 2**20, None)
    n = api.calls.count("nvmlDeviceGetMemoryInfo")
    assert n == 3  # v2 tried once, then v1 for both GPUs
    mon.read()
    assert api.calls.count("nvmlDeviceGetMemoryInfo") == n + 2  # v2 not retried


def test_v2_not_supported_code_also_falls_back() -> None:
    dev = two_gpus()[0]
    api = FakeNvml([dev])
    orig = api.nvmlDeviceGetMemoryInfo

    def get_mem(h: FakeDev, version: int | None = None) -> Any:
        if version:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return orig(h)

    api.nvmlDeviceGetMemoryInfo = get_mem  # type: ignore[method-assign]
    mon = GpuMonitor(api)
    mon.start()
    (g,) = mon.read()
    assert g.ok and g.reserved is None and g.used == 60 * GiB + 512 * 2**20


def test_mig_devices_are_enumerated_and_empty_slots_skipped() -> None:
    mig0 = FakeDev("MIG-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, 0, 5 * GiB,
                   procs=[proc(42, 5 * GiB)])
    mig2 = FakeDev("MIG-2222", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB, 0, 0)
    parent = FakeDev("GPU-cccc", "NVIDIA A100-SXM4-40GB", 40 * GiB, 0, 5 * GiB,
                     mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, migs={0: mig0, 2: mig2}, max_migs=7,
                     fail={"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION})
    mon = GpuMonitor(FakeNvml([parent]))
    mon.start()
    (g,) = mon.read()
    assert g.ok and g.mig_enabled and g.processes is None  # parent's list needs privileges
    assert g.mig_devices == (
        MigDeviceMemory(0, "MIG-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, 5 * GiB,
                        15 * GiB, 0, (GpuProcess(42, 5 * GiB),)),
        MigDeviceMemory(2, "MIG-2222", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB, 0,
                        10 * GiB, 0, ()),
    )


def test_mig_disabled_reports_no_mig_devices() -> None:
    dev = two_gpus()[0]
    dev.mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE
    mon = GpuMonitor(FakeNvml([dev]))
    mon.start()
    (g,) = mon.read()
    assert g.ok and not g.mig_enabled and g.mig_devices == ()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_one_warning_and_unavailable(code: int) -> None:
    api = FakeNvml(two_gpus(), init_error=code)
    mon = GpuMonitor(api)
    with capture_logs() as logs:
        assert mon.start() is False
        assert mon.start() is False  # no retry, no second warning
        assert mon.read() == ()
        assert mon.read() == ()
        mon.close()
    assert not mon.available
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and len(logs) == 1
    assert warnings[0]["event"].startswith("no NVML: ") and warnings[0]["code"] == code
    assert api.calls == ["nvmlInit"]  # no shutdown after a failed init


def test_gpu_lost_on_one_device_other_reads_fine() -> None:
    devs = two_gpus()
    devs[0].fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    mon = GpuMonitor(FakeNvml(devs))
    mon.start()
    with capture_logs() as logs:
        g0, g1 = mon.read()
        mon.read()
    assert g0.lost and not g0.ok and g0.uuid == "GPU-aaaa" and g0.total is None
    assert "GpuIsLost" in (g0.error or "")
    assert g1.ok and not g1.lost and g1.total == 80 * GiB
    assert [e["event"] for e in logs] == ["GPU is lost"]  # once, not per read


def test_gpu_lost_on_handle_and_in_mig_device() -> None:
    mig = FakeDev("MIG-1", "m", GiB, 0, 0, fail={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST})
    devs = [
        FakeDev("GPU-x", "x", GiB, 0, 0, fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST}),
        FakeDev("GPU-y", "y", GiB, 0, 0, mig_mode=1, migs={0: mig}, max_migs=1),
    ]
    mon = GpuMonitor(FakeNvml(devs))
    mon.start()
    g0, g1 = mon.read()
    assert g0.lost and g0.uuid is None
    assert g1.lost and g1.uuid == "GPU-y" and g1.mig_devices == ()


def test_other_per_device_error_goes_to_error_field() -> None:
    devs = two_gpus()
    devs[1].fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_UNKNOWN
    mon = GpuMonitor(FakeNvml(devs))
    mon.start()
    g0, g1 = mon.read()
    assert g0.ok
    assert not g1.ok and not g1.lost and "Unknown" in (g1.error or "") and g1.used is None


def test_mig_device_error_is_per_mig_device() -> None:
    bad = FakeDev("MIG-b", "m", GiB, 0, 0, fail={"nvmlDeviceGetName": pynvml.NVML_ERROR_UNKNOWN})
    good = FakeDev("MIG-g", "m", GiB, 0, 0)
    parent = FakeDev("GPU-p", "p", 2 * GiB, 0, 0, mig_mode=1, migs={0: bad, 1: good}, max_migs=2)
    mon = GpuMonitor(FakeNvml([parent]))
    mon.start()
    (g,) = mon.read()
    assert g.ok
    assert [m.ok for m in g.mig_devices] == [False, True]
    assert g.mig_devices[0].uuid == "MIG-b" and g.mig_devices[0].total is None


def test_count_failure_returns_empty() -> None:
    api = FakeNvml(two_gpus())
    mon = GpuMonitor(api)
    mon.start()

    def broken_count() -> int:
        raise err(pynvml.NVML_ERROR_UNKNOWN)

    api.nvmlDeviceGetCount = broken_count  # type: ignore[method-assign]
    assert mon.read() == ()


def test_init_once_shutdown_once() -> None:
    api = FakeNvml(two_gpus())
    mon = GpuMonitor(api)
    mon.start()
    mon.start()
    mon.read()
    mon.close()
    mon.close()
    assert api.calls.count("nvmlInit") == 1
    assert api.calls.count("nvmlShutdown") == 1
    assert api.inited == 0
    assert not mon.available and mon.read() == ()


def test_context_manager_and_shutdown_error_swallowed() -> None:
    api = FakeNvml(two_gpus())

    def bad_shutdown() -> None:
        api.calls.append("nvmlShutdown")
        raise err(pynvml.NVML_ERROR_UNKNOWN)

    api.nvmlShutdown = bad_shutdown  # type: ignore[method-assign]
    with GpuMonitor(api) as mon:
        assert len(mon.read()) == 2
    assert api.calls.count("nvmlShutdown") == 1


def test_real_pynvml_on_this_machine_degrades_cleanly() -> None:
    mon = GpuMonitor()  # the real pynvml module
    with capture_logs() as logs:
        available = mon.start()
    try:
        if available:  # a machine with a driver: reading must work too
            got = mon.read()
            assert isinstance(got, tuple) and all(isinstance(g, GpuMemory) for g in got)
        else:
            assert mon.read() == ()
            assert len(logs) == 1 and logs[0]["event"].startswith("no NVML: ")
            assert mon.unavailable_reason
    finally:
        mon.close()
