"""Device memory for the TensorRT backend through cuda-python (no PyTorch on the device).

`DeviceMemory` is the whole surface the backend needs; `CudaDevice` implements it with the
CUDA runtime API on one stream. Tests implement it over host memory.
"""

from __future__ import annotations

from types import ModuleType
from typing import Protocol

import numpy as np

from edgeprefill.engines.gpu_libs import require_cudart
from edgeprefill.errors import BackendError


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


class CudaDevice:
    """DeviceMemory on the current CUDA device, with one stream."""

    def __init__(self, cudart: ModuleType | None = None) -> None:
        self.rt = cudart or require_cudart()
        self.stream = int(self._check("cudaStreamCreate", self.rt.cudaStreamCreate()))

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

    def _check(self, what: str, result):
        """cuda-python returns (error, *values): raise on error, return the value."""
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            _, text = self.rt.cudaGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else text
            raise BackendError(f"CUDA {what} failed: {text}")
        return values[0] if len(values) == 1 else (values or None)
