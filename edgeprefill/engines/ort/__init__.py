"""The ONNX Runtime backend.

Files: `backend.py` (sessions, IOBinding by address, one step per call), `arena.py` (a KV
arena in device memory for the CUDA/TensorRT providers), `providers.py` (execution-provider
options and the check that ONNX Runtime did not fall back to the CPU).
"""
