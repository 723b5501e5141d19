"""Device memory for the TensorRT backend through cuda-python (no PyTorch on the device).

`DeviceMemory` is the whole surface the backend needs; `CudaDevice` implements it with the
CUDA runtime API on one stream. Tests implement it over host memory.
"""

from __future__ import annotations

from importlib import metadata
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from edgeprefill.engines.gpu_libs import require_cudart, version_tuple
from edgeprefill.errors import BackendError

CUDA_MAJORS = (11, 12, 13, 14)  # the tensorrt-cuXX wheels that may be installed


class DeviceMemory(Protocol):
    stream: int  # the stream every call is ordered on (a cudaStream_t handle)

    def alloc(self, nbytes: int) -> int:
        """A zero-filled device buffer; returns its address."""

    def free(self, address: int) -> None: ...

    def upload(self, address: int, array: np.ndarray) -> None:
        """Host -> device, ordered on the stream. `array` must be C-contiguous."""

    def download(self, array: np.ndarray, address: int) -> None:
        """Device -> host into `array`; returns when the bytes have arrived."""

    def copy_rows(
        self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int
    ) -> None:
        """Device -> device: `height` rows of `width` bytes, each a pitch apart."""

    def synchronize(self) -> None: ...

    def close(self) -> None:
        """Release the stream; the device is unusable afterwards."""


class CudaDevice:
    """DeviceMemory on the current CUDA device, with one stream."""

    def __init__(self, cudart: ModuleType | None = None) -> None:
        self.rt = cudart or require_cudart()
        driver = int(self._check("cudaDriverGetVersion", self.rt.cudaDriverGetVersion()))
        problem = cuda_mismatch(bindings_major(), driver, tensorrt_cuda_major())
        if problem:
            raise BackendError(problem)
        self.stream = int(self._check("cudaStreamCreate", self.rt.cudaStreamCreate()))

    def close(self) -> None:
        if self.stream:
            stream, self.stream = self.stream, 0
            self._check("cudaStreamDestroy", self.rt.cudaStreamDestroy(stream))

    def info(self) -> tuple[str, str]:
        """(GPU name, compute capability "major.minor") of the current device."""
        device = self._check("cudaGetDevice", self.rt.cudaGetDevice())
        props = self._check("cudaGetDeviceProperties", self.rt.cudaGetDeviceProperties(device))
        name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
        return name.rstrip("\x00").strip(), f"{props.major}.{props.minor}"

    def alloc(self, nbytes: int) -> int:
        address = int(self._check("cudaMalloc", self.rt.cudaMalloc(max(nbytes, 1))))
        self._check("cudaMemsetAsync", self.rt.cudaMemsetAsync(address, 0, nbytes, self.stream))
        return address

    def free(self, address: int) -> None:
        self._check("cudaFree", self.rt.cudaFree(address))

    def upload(self, address: int, array: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(
            address, array.ctypes.data, array.nbytes, kind, self.stream))

    def download(self, array: np.ndarray, address: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(
            array.ctypes.data, address, array.nbytes, kind, self.stream))
        self.synchronize()

    def copy_rows(
        self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int
    ) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        self._check("cudaMemcpy2DAsync", self.rt.cudaMemcpy2DAsync(
            dst, dst_pitch, src, src_pitch, width, height, kind, self.stream))

    def synchronize(self) -> None:
        self._check("cudaStreamSynchronize", self.rt.cudaStreamSynchronize(self.stream))

    def _check(self, what: str, result: Any) -> Any:
        """cuda-python returns (error, *values): raise on error, return the value."""
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            _, text = self.rt.cudaGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else text
            raise BackendError(f"CUDA {what} failed: {text}")
        return values[0] if len(values) == 1 else (values or None)


def device_info() -> tuple[str, str]:
    """(GPU name, compute capability) of the current device, its stream released."""
    device = CudaDevice()
    try:
        return device.info()
    finally:
        device.close()


def cuda_mismatch(
    bindings: int | None, driver_version: int, tensorrt_cuda: int | None
) -> str | None:
    """Why cuda-python of major `bindings` cannot drive this machine, or None.

    `driver_version` is cudaDriverGetVersion's (12060: the driver supports CUDA 12.6);
    `tensorrt_cuda` the CUDA major of the installed tensorrt-cuXX wheel (None: unknown, as
    with JetPack's TensorRT). cuda-python newer than the driver fails at its first call;
    one of another major than TensorRT's loads a second CUDA runtime beside TensorRT's.
    """
    driver_major, driver_minor = driver_version // 1000, driver_version % 1000 // 10
    if bindings is None:
        return None
    if bindings > driver_major:
        return (f"cuda-python {bindings}.x needs a driver for CUDA {bindings}, and this "
                f"driver supports CUDA {driver_major}.{driver_minor}: "
                f"{_pin(tensorrt_cuda or driver_major)}")
    if tensorrt_cuda is not None and tensorrt_cuda != bindings:
        return (f"TensorRT is built for CUDA {tensorrt_cuda} but cuda-python is {bindings}.x: "
                f"{_pin(tensorrt_cuda)}")
    return None


def bindings_major() -> int | None:
    """The installed cuda-python's major version (cuda-bindings from 12.6 on)."""
    for name in ("cuda-bindings", "cuda-python"):
        try:
            return version_tuple(metadata.version(name))[0]
        except (metadata.PackageNotFoundError, IndexError):
            continue
    return None


def tensorrt_cuda_major() -> int | None:
    """The CUDA major of the installed tensorrt-cuXX wheel, None when none is (JetPack)."""
    for major in CUDA_MAJORS:
        for name in (f"tensorrt-cu{major}", f"tensorrt-cu{major}-libs"):
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            return major
    return None


def _pin(major: int) -> str:
    return f"pip install 'cuda-python>={major},<{major + 1}' (or edgeprefill[tensorrt-cu{major}])"
