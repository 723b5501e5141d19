"""Native kernels: an optional ONNX Runtime custom-op library built on the user's machine.

Files: `decode_attention.cc` (the `edgeprefill.DecodeAttention` op: one new token per row,
rotary inside, the cache written in place, each KV head read once for its query group,
positions split over ONNX Runtime's pool), `prefill_attention.cc` (the
`edgeprefill.PrefillAttention` op: a chunk's causal attention, flash-style: query blocks of
a whole KV group, online softmax, the causal upper triangle skipped, AVX-512 (or AVX2)
register tiles, pieces on the pool), `kernel_common.h` and `library.cc` (what the ops share, and
`RegisterCustomOps`), `build.py` (compiles them with g++ against ONNX Runtime's C API
headers fetched at build time; `python -m edgeprefill.kernels.build`), `graph.py` (puts
PrefillAttention in for every GroupQueryAttention it supports, in memory: its rows of one
token run DecodeAttention's code, `decode_rows.h`), `select.py` (at load: native or the
stock graph, and the reason, for `--stats`/`inspect`); `gated_delta.cc` and `gated_delta.py`
(the `edgeprefill.GatedDeltaRule` op, Qwen3.5's DeltaNet recurrence per (row, head), and
its switch in for the exporter's `Scan`); `mamba2_scan.cc` and `mamba2_scan.py` (the
`edgeprefill.Mamba2Scan` op, the Mamba-2 SSM recurrence per (row, head), and its switch);
`scan_body.py` (how both switches know the exporter's Scan by its body).

Everything works without the library: bundles on disk are never changed, and a missing
library means the stock GroupQueryAttention graph.
"""
