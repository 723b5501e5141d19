"""The ONNX Runtime backend.

Files: `backend.py` (sessions, IOBinding by address, one step per call), `arena.py` (the
`KVArena` interface: `HostArena` in numpy for the CPU, `DeviceArena` in device memory for
the CUDA provider), `providers.py` (execution-provider
options and the check that ONNX Runtime did not fall back to the CPU).
"""
