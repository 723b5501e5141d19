"""The TensorRT backend, built from the `standard` flavour of a bundle.

Files: `backend.py` (the Backend: moves bytes), `steps.py` (bucket, padding and binding plan
of a step; pure, tested on the CPU), `plan.py` (optimization profiles), `runtime.py`
(engine, contexts, streams), `cache.py` (engine cache key and records), `graph.py` (graph
preparation for the parser), `ops.py` (the supported-operator table), `build.py` (engine
build), `cuda.py` (device memory through cuda-python).
"""
