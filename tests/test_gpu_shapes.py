"""On a GPU provider a prefill chunk is padded to a bucket and the load runs every shape once
(engines/ort/gpu_shapes.py: the CUDA provider pays 33-45 ms for each shape it has not run).
What the CPU can prove: the padding and the warm-up's shapes, that a padded chunk gives the
unpadded chunk's logits and leaves the next steps theirs (its padded K/V and states never
read), and that the backend pads and warms so where it has a GPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import backend as ort_backend
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.gpu_shapes import padded, warm_up_steps
from tests.test_gpu_providers import CpuArenaBackend

BUCKETS = (16, 64, 256)


def step(ids, past: int) -> StepBatch:
    ids = np.array([ids], np.int64)
    return StepBatch(ids, np.array([past], np.int32), np.array([ids.shape[1]], np.int32), 0)


def test_a_chunk_is_padded_to_the_smallest_bucket_that_ends_inside_the_capacity():
    five = padded(step([7, 8, 9, 10, 11], 0), BUCKETS, 128)
    assert five.input_ids.shape == (1, 16)
    assert five.input_ids[0, :5].tolist() == [7, 8, 9, 10, 11] and not five.input_ids[0, 5:].any()
    assert five.valid_lens.tolist() == [5] and five.past_lens.tolist() == [0]
    assert padded(step([1] * 20, 0), BUCKETS, 128).chunk == 64
    assert padded(step([1] * 20, 100), BUCKETS, 128).chunk == 20  # 64 would pass 128
    assert padded(step([1] * 100, 0), BUCKETS, 128).chunk == 100  # 256 would pass 128
    assert padded(step([1] * 64, 0), BUCKETS, 128).chunk == 64  # a bucket's width already
    decode = StepBatch(np.ones((3, 1), np.int64), np.array([4, 9, 2], np.int32),
                       np.ones(3, np.int32), 0)
    assert padded(decode, BUCKETS, 128) is decode


def test_the_warm_up_runs_each_bucket_that_fits_and_each_decode_width():
    steps = warm_up_steps(BUCKETS, 128, 3)
    assert [s.input_ids.shape for s in steps] == [(1, 16), (1, 64), (1, 1), (2, 1), (3, 1)]
    assert all(s.first_slot == 0 and not s.past_lens.any() for s in steps)
    assert [s.valid_lens.tolist() for s in steps] == [[16], [64], [1], [1, 1], [1, 1, 1]]


def _backend(bundle_dir) -> OnnxRuntimeBackend:
    backend = OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), BackendOptions())
    backend.allocate_kv(slots=2, capacity=128)
    return backend


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text"])  # KV, and KV beside states
def test_a_padded_chunk_computes_the_unpadded_chunks_logits_and_the_steps_after(
        bundle, family):
    path = bundle(family)
    vocab = load_manifest(path).model.vocab_size
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, vocab, 29).tolist()
    buckets = load_manifest(path).chunks  # 16, 64
    plain, pad = _backend(path), _backend(path)
    for start, end in ((0, 16), (16, 29)):  # a whole bucket, then 13 padded to 16
        a = plain.run(step(prompt[start:end], start)).copy()
        b = pad.run(padded(step(prompt[start:end], start), buckets, 128)).copy()
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    token = int(np.argmax(a[0]))
    for position in range(29, 33):  # decode over the positions the padding wrote
        one = step([token], position)
        a, b = plain.run(one).copy(), pad.run(one).copy()
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        token = int(np.argmax(a[0]))


def test_the_backend_pads_and_warms_every_shape_on_its_gpu_code_path(bundle, monkeypatch):
    """The backend's GPU code path (tests/test_gpu_providers.py's CpuArenaBackend: its
    device arena in CPU OrtValues) sends a bucket's width and lists every shape to warm;
    the CPU path neither. The padded call's logits are the CPU path's."""
    path = bundle("llama")
    manifest = load_manifest(path)
    host, gpu_path = _backend(path), CpuArenaBackend(path, manifest, BackendOptions())
    gpu_path.allocate_kv(slots=2, capacity=128)
    sent = []

    def recorded(step, buckets, capacity):
        sent.append(padded(step, buckets, capacity).input_ids.shape)
        return padded(step, buckets, capacity)

    monkeypatch.setattr(ort_backend, "padded", recorded)
    thirteen = step(list(range(5, 18)), 0)
    np.testing.assert_allclose(gpu_path.run(thirteen), host.run(thirteen), rtol=1e-5, atol=1e-5)
    assert sent == [(1, 16)]  # the host backend padded nothing
    assert [s.input_ids.shape for s in host.warm_up_steps(64, 2)] == [(1, 64), (2, 1)]
    shapes = [s.input_ids.shape for s in gpu_path.warm_up_steps(64, 2)]
    assert shapes == [(1, 16), (1, 64), (1, 1), (2, 1)]
