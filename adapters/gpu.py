"""GPU memory from NVML (``nvidia-ml-py``, imported as ``pynvml``), read behind a small interface.

``NvmlApi`` lists exactly the pynvml calls this adapter makes; the real implementation is the
``pynvml`` module itself, tests pass a fake raising real ``pynvml.NVMLError(code)`` instances.

``GpuMonitor`` lifecycle::

    mon = GpuMonitor()          # api=pynvml
    mon.start()                 # nvmlInit() once; no driver -> ONE warning "no NVML: ...", available=False
    mon.read()                  # tuple[GpuMemory, ...]; () when NVML is unavailable (use engine metrics)
    mon.close()                 # nvmlShutdown() once, only if nvmlInit() succeeded

Errors are translated here: no ``NVMLError`` (nor ``NVMLLibraryMismatchError``) leaves this module.
A GPU that fell off the bus (``NVML_ERROR_GPU_IS_LOST``) is reported with ``lost=True``; any other
per-device NVML error is reported in that device's ``error`` field while the other GPUs read normally.

Memory: ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` first (``used`` = allocated, ``reserved``
separate); on ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` the v1 call is used from then on
(``used`` includes reserved memory, ``reserved`` is ``None``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, Self

import pynvml
import structlog

log = structlog.get_logger("controlplane.adapters.gpu")

# Codes used below (values from nvml.h, re-exported by pynvml).
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE


class NvmlApi(Protocol):
    """The pynvml calls used by ``GpuMonitor`` (the ``pynvml`` module satisfies it)."""

    nvmlMemory_v2: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None when the driver does not report it (WDDM)


@dataclass(frozen=True)
class MigDeviceMemory:
    """One MIG device (slot ``index`` of its parent GPU). Byte fields are None when ``error`` is set."""

    index: int
    uuid: str | None
    name: str | None
    total: int | None
    used: int | None
    free: int | None
    reserved: int | None  # None with the v1 memory call
    processes: tuple[GpuProcess, ...] | None  # None when the process list is unavailable
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class GpuMemory:
    """One physical GPU. Byte fields are None when ``error`` is set (``lost`` GPUs included)."""

    index: int
    uuid: str | None
    name: str | None
    total: int | None
    used: int | None
    free: int | None
    reserved: int | None  # None with the v1 memory call
    processes: tuple[GpuProcess, ...] | None  # None when the process list is unavailable
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceMemory, ...] = ()
    lost: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _describe(exc: BaseException) -> str:
    code = _code(exc)
    return f"{type(exc).__name__}({code}): {exc}" if code is not None else f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Lost(Exception):
    """GPU_IS_LOST seen while reading a MIG device: the whole parent GPU is lost."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class _Partial:
    uuid: str | None = None
    name: str | None = None


class GpuMonitor:
    """Reads per-GPU (and per-MIG-device) memory through NVML; degrades to ``available=False``."""

    def __init__(self, api: NvmlApi | None = None) -> None:
        self._api: Any = pynvml if api is None else api
        self._lock = threading.Lock()
        self._started = False
        self._initialized = False  # nvmlInit() succeeded and nvmlShutdown() not yet called
        self._closed = False
        self._v2 = hasattr(self._api, "nvmlMemory_v2")
        self._lost: set[int] = set()
        self.unavailable_reason: str | None = None

    @property
    def available(self) -> bool:
        return self._initialized

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> bool:
        """Call ``nvmlInit`` once. Returns ``available``; never raises an NVML error."""
        with self._lock:
            if self._started:
                return self._initialized
            self._started = True
            try:
                self._api.nvmlInit()
            except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, OSError) as exc:
                self.unavailable_reason = _describe(exc)
                log.warning(
                    f"no NVML: {exc}",
                    code=_code(exc),
                    error=type(exc).__name__,
                    fallback="engine metrics",
                )
                return False
            self._initialized = True
            return True

    def close(self) -> None:
        """Call ``nvmlShutdown`` once (only if ``nvmlInit`` succeeded). Idempotent, never raises."""
        with self._lock:
            self._closed = True
            if not self._initialized:
                return
            self._initialized = False
            try:
                self._api.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("nvmlShutdown failed", error=_describe(exc))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---------------------------------------------------------------- reading

    def read(self) -> tuple[GpuMemory, ...]:
        """One snapshot of every GPU; ``()`` when NVML is unavailable (not started, no driver, closed)."""
        with self._lock:
            if not self._initialized:
                return ()
            try:
                count = int(self._api.nvmlDeviceGetCount())
            except pynvml.NVMLError as exc:
                log.warning("nvmlDeviceGetCount failed; no GPU readings", error=_describe(exc))
                return ()
            return tuple(self._read_gpu(i) for i in range(count))

    def _read_gpu(self, index: int) -> GpuMemory:
        part = _Partial()
        try:
            handle = self._api.nvmlDeviceGetHandleByIndex(index)
            part.uuid = _text(self._api.nvmlDeviceGetUUID(handle))
            part.name = _text(self._api.nvmlDeviceGetName(handle))
            total, used, free, reserved = self._memory(handle)
            processes = self._processes(handle)
            mig_enabled = self._mig_enabled(handle)
            migs = self._read_migs(handle) if mig_enabled else ()
        except (pynvml.NVMLError, _Lost) as exc:
            cause = exc.cause if isinstance(exc, _Lost) else exc
            lost = _code(cause) == _GPU_IS_LOST
            if lost:
                if index not in self._lost:
                    self._lost.add(index)
                    log.warning("GPU is lost", gpu=index, uuid=part.uuid)
            else:
                log.warning("GPU read failed", gpu=index, uuid=part.uuid, error=_describe(cause))
            return GpuMemory(
                index=index, uuid=part.uuid, name=part.name, total=None, used=None, free=None,
                reserved=None, processes=None, lost=lost, error=_describe(cause),
            )
        if index in self._lost:
            self._lost.discard(index)
            log.info("GPU is back", gpu=index, uuid=part.uuid)
        return GpuMemory(
            index=index, uuid=part.uuid, name=part.name, total=total, used=used, free=free,
            reserved=reserved, processes=processes, mig_enabled=mig_enabled, mig_devices=migs,
        )

    def _memory(self, handle: Any) -> tuple[int, int, int, int | None]:
        if self._v2:
            try:
                m = self._api.nvmlDeviceGetMemoryInfo(handle, version=self._api.nvmlMemory_v2)
                return int(m.total), int(m.used), int(m.free), int(m.reserved)
            except pynvml.NVMLError as exc:
                if _code(exc) not in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                    raise
                self._v2 = False  # the driver lacks v2: use v1 from now on
                log.info("nvmlDeviceGetMemoryInfo v2 unavailable; using v1", error=_describe(exc))
        m = self._api.nvmlDeviceGetMemoryInfo(handle)
        return int(m.total), int(m.used), int(m.free), None

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        try:
            procs = self._api.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLLibraryMismatchError:
            return None
        except pynvml.NVMLError as exc:
            if _code(exc) == _GPU_IS_LOST:
                raise
            return None  # NOT_SUPPORTED / NO_PERMISSION (e.g. MIG parent without privileges)
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(pid=int(p.pid), used_bytes=None if used is None else int(used)))
        return tuple(out)

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current = self._api.nvmlDeviceGetMigMode(handle)[0]
        except pynvml.NVMLError as exc:
            if _code(exc) in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                return False
            raise
        return bool(current == _MIG_ENABLE)

    def _read_migs(self, handle: Any) -> tuple[MigDeviceMemory, ...]:
        slots = int(self._api.nvmlDeviceGetMaxMigDeviceCount(handle))
        out = []
        for slot in range(slots):
            try:
                mig = self._api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                if _code(exc) == _NOT_FOUND:
                    continue  # empty slot
                if _code(exc) == _GPU_IS_LOST:
                    raise _Lost(exc) from exc
                out.append(MigDeviceMemory(slot, None, None, None, None, None, None, None, _describe(exc)))
                continue
            out.append(self._read_mig(slot, mig))
        return tuple(out)

    def _read_mig(self, slot: int, mig: Any) -> MigDeviceMemory:
        part = _Partial()
        try:
            part.uuid = _text(self._api.nvmlDeviceGetUUID(mig))
            part.name = _text(self._api.nvmlDeviceGetName(mig))
            total, used, free, reserved = self._memory(mig)
            processes = self._processes(mig)
        except pynvml.NVMLError as exc:
            if _code(exc) == _GPU_IS_LOST:
                raise _Lost(exc) from exc
            return MigDeviceMemory(
                slot, part.uuid, part.name, None, None, None, None, None, error=_describe(exc)
            )
        return MigDeviceMemory(slot, part.uuid, part.name, total, used, free, reserved, processes)
