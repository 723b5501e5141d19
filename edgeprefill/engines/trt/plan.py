"""The optimization profiles of the one TensorRT engine built from the chunk graph.

One engine holds the weights once and one profile per shape family it runs:

  prefill profile per chunk bucket   B = 1,              C = bucket (fixed: chunks are padded)
  decode profile                     B = 1..max_batch,   C = 1

The KV inputs have a static capacity in every profile (TensorRT's KV-cache update layer
needs a static sequence axis); only their batch axis follows the profile's B.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

from edgeprefill.bundle import Manifest
from edgeprefill.contract import BATCH, CAPACITY, CHUNK
from edgeprefill.errors import BackendError

TENSOR_ALIGNMENT = 256  # bytes: TensorRT rejects (or misreads) tensor addresses off this
Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape

    def contains(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max, strict=True)
        )


@dataclass(frozen=True)
class Profile:
    name: str  # "prefill-64" or "decode"
    chunk: int  # C of every call in this profile
    max_batch: int  # largest B (1 for prefill profiles)
    shapes: dict[str, ShapeRange]  # every graph input


@dataclass(frozen=True)
class ProfilePlan:
    profiles: tuple[Profile, ...]  # index = TensorRT optimization profile index
    buckets: tuple[int, ...]  # prefill chunk buckets with a profile, ascending
    capacity: int
    max_batch: int

    @property
    def decode_index(self) -> int:
        return len(self.profiles) - 1

    def bucket_index(self, bucket: int) -> int:
        return self.buckets.index(bucket)


def profile_plan(manifest: Manifest, capacity: int, max_batch: int) -> ProfilePlan:
    """Profiles for the manifest's buckets (those that fit the capacity), decode last."""
    check_capacity(manifest, capacity)
    check_alignment(manifest, capacity)
    if max_batch < 1:
        raise BackendError(f"--max-batch must be at least 1, got {max_batch}")
    # A bucket of 1 is the decode profile's B=1 case; a bucket over the capacity never fits.
    buckets = tuple(b for b in sorted(set(manifest.chunks)) if 1 < b <= capacity)
    profiles = [_profile(manifest, f"prefill-{b}", b, (1, 1, 1), capacity) for b in buckets]
    # Decode cost is dominated by reading the weights, nearly flat in B: tune for the top.
    batch = (1, max_batch, max_batch)
    profiles.append(_profile(manifest, "decode", 1, batch, capacity))
    return ProfilePlan(tuple(profiles), buckets, capacity, max_batch)


def position_bytes(manifest: Manifest) -> int:
    """Bytes of one position of one slot in one KV arena: kv_heads x head_dim x itemsize."""
    past = manifest.graph.kv_inputs[0][0]
    dtype = np.dtype(manifest.graph.inputs[past][0])
    return manifest.model.num_kv_heads * manifest.model.head_dim * int(dtype.itemsize)


def capacity_step(manifest: Manifest) -> int:
    """Capacities that are a multiple of this make every slot of an arena (slot bytes =
    capacity x position bytes) start on TensorRT's 256-byte alignment."""
    return TENSOR_ALIGNMENT // gcd(TENSOR_ALIGNMENT, position_bytes(manifest))


def aligned_capacity(manifest: Manifest, capacity: int) -> int:
    """`capacity` rounded up to a multiple of capacity_step, or down when up would pass the
    bundle's max context (odd KV heads with an odd capacity, e.g. SmolLM2 fp16 at 2047)."""
    check_capacity(manifest, capacity)
    step = capacity_step(manifest)
    up = -(-capacity // step) * step
    if up <= manifest.max_context:
        return up
    down = capacity // step * step
    if down < 2:
        raise BackendError(f"no KV capacity up to {manifest.max_context} keeps the KV slots "
                           f"{TENSOR_ALIGNMENT}-byte aligned (multiples of {step})")
    return down


def check_alignment(manifest: Manifest, capacity: int) -> None:
    step = capacity_step(manifest)
    if capacity % step:
        raise BackendError(
            f"a KV capacity of {capacity} puts KV slots off TensorRT's {TENSOR_ALIGNMENT}-byte "
            f"alignment; use a multiple of {step} (`edgeprefill build` rounds it)"
        )


def check_capacity(manifest: Manifest, capacity: int) -> None:
    # The rotary table of the graph holds positions up to the bundle's max context.
    if not 2 <= capacity <= manifest.max_context:
        raise BackendError(
            f"KV capacity must be in 2..{manifest.max_context} for this bundle, got {capacity}"
        )


def _profile(
    manifest: Manifest, name: str, chunk: int, batch: tuple[int, int, int], capacity: int
) -> Profile:
    shapes = {}
    for input_name, (_, dims) in manifest.graph.inputs.items():
        ends = [_resolve(dims, {BATCH: b, CHUNK: chunk, CAPACITY: capacity}) for b in batch]
        shapes[input_name] = ShapeRange(*ends)
    return Profile(name, chunk, batch[2], shapes)


def _resolve(dims: list[str | int], values: dict[str, int]) -> Shape:
    try:
        return tuple(values[d] if isinstance(d, str) else int(d) for d in dims)
    except KeyError as err:
        raise BackendError(f"the graph has an unknown symbolic axis {err}") from None
