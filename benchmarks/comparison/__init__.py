"""The comparative benchmark behind benchmarks/compare.py, one concern per module.

Files: `settings.py` (the run's typed settings, paths, model shapes), `procs.py` (child
processes with pinned threads and logs), `venvs.py` (one virtualenv per comparator under
benchmarks/work/venvs), `registry.py` (the comparators: one `Runtime` entry each),
`exporters.py` (the export command of each exporter family), `models.py` (the random
checkpoint and the prompts), `runners.py` (export and measure one runtime, pool rounds),
`ceilings.py` (GEMM rate, bandwidth and the floors derived from them), `report.py` (the
tables). Adding a comparator is an entry in registry.py and a runner file in
benchmarks/runners/ (plus an exporter and a venv when it brings its own).

Standard library only, so any Python >= 3.10 runs it.
"""
