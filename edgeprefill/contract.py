"""The chunk-graph contract as code: the one place that names the step tensors, their
symbolic axes and the per-layer KV names (docs/design.md, "The chunk-graph contract").

One call runs one step: B rows of C tokens, against KV buffers of a fixed capacity.

  inputs   input_ids         [batch, chunk]                          int64
           past_lens         [batch]                                 int32
           valid_lens        [batch]                                 int32
           past_key.{i}      [batch, kv_heads, capacity, head_dim]   model dtype
                             (the layer's own kv_heads and head_dim where ModelInfo.layer_kv
                             lists it)
           past_value.{i}    (the same)
           past_{kind}.{i}   [batch, ...]                            the graph's own
  outputs  logits            [batch, vocab]                          float32
           (or, in an embedding or score bundle, manifest task "embed"/"score", in its place:)
           hidden            [batch, hidden_size]                    float32
           present_key.{i}   the buffer of past_key.{i}, updated in place
           present_value.{i} the buffer of past_value.{i}
           present_{kind}.{i} as past_{kind}.{i}

A bundle's one output besides its KV and states is `logits` (a generation bundle) or
`hidden` (an embedding bundle: the manifest's task "embed"; a score bundle, task "score",
whose head the runtime applies to it): the final-normed hidden state
of each row's last valid token, what the logits are computed from, before any LM head or
logit scaling. The runtime reads either through `step_output`.

An attention layer i has the four KV tensors, unless it is one of the model's
`shared_kv_layers` (Gemma 4), which has none and reads, inside the graph, the present KV
of an earlier layer, or one of its `attention_free_layers` (Llama-Nemotron's NAS blocks
whose attention is left out or one linear layer), which has none and needs none; a layer
listed in the model's `state_layers` has none, and carries instead one or more recurrent
states (STATE_KINDS): `conv`, the last inputs of a causal convolution (LFM2's short
convolutions, a Gated DeltaNet's q/k/v convolution, a Mamba-2 mixer's x/B/C
convolution, ZAYA's raw q/k), and `recurrent`, a Gated DeltaNet's [v_heads, k_dim, v_dim]
matrix or a Mamba-2 mixer's [heads, head_dim, state_size] state per row (float32 whatever
the model's dtype), or ZAYA's last delayed value (the model's dtype); an xLSTM layer
carries `recurrent` alone (its mLSTM's memory, normalizer and stabilizer, float32). A
layer also in the model's `kv_state_layers` keeps its KV beside its states (Falcon-H1:
attention and Mamba-2 side by side in each layer; ZAYA: attention through its CCA
projection). Each is read from
`past_{kind}.{i}` (zeros where a row's past length is 0) and written, ending at the row's
last valid token, to `present_{kind}.{i}`, a separate buffer the runtime copies back into
the slot. A state's shape and dtype are the graph's own (its input's, batch first); the
contract fixes its names and that the present one matches the past one.

A layer listed in the manifest's `graph.value_is_key` (multi-head latent attention,
absorbed: its value is its key) writes into present_value.{i} exactly what it writes into
present_key.{i}: a runtime may bind ONE buffer as past_key.{i}, past_value.{i} and both
present outputs (`kv_buffers`), and the cache of such a layer takes half the memory.

The exporter writes graphs and manifests from these names; the runtime and the backends
bind by them; `check_graph_io` refuses a manifest whose graph differs, and
`check_loaded_io` a graph file that differs from its manifest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from edgeprefill.errors import BundleError

if TYPE_CHECKING:
    from edgeprefill.bundle import GraphInfo, Manifest

INPUT_IDS = "input_ids"
PAST_LENS = "past_lens"
VALID_LENS = "valid_lens"
LOGITS = "logits"
HIDDEN = "hidden"  # an embedding bundle's output in place of LOGITS
HIDDEN_TASKS = ("embed", "score")  # the manifest's tasks whose graph gives HIDDEN
BATCH, CHUNK, CAPACITY = "batch", "chunk", "capacity"  # the graph's symbolic axes

Axis = str | int  # a symbolic axis name or a fixed size


class KVNames(NamedTuple):
    """One layer's four cache tensor names."""

    past_key: str
    past_value: str
    present_key: str
    present_value: str


def kv_names(layer: int) -> KVNames:
    return KVNames(f"past_key.{layer}", f"past_value.{layer}",
                   f"present_key.{layer}", f"present_value.{layer}")


# The kinds of recurrent state a layer without KV may carry, in the order a layer lists them.
CONV, RECURRENT = "conv", "recurrent"
STATE_KINDS = (CONV, RECURRENT)
STATE_NAME = re.compile(r"past_(conv|recurrent)\.(\d+)")


class StateNames(NamedTuple):
    """One recurrent state of a layer: the input read and the output written."""

    past: str
    present: str


def state_names(layer: int, kind: str = CONV) -> StateNames:
    return StateNames(f"past_{kind}.{layer}", f"present_{kind}.{layer}")


def attention_layers(num_layers: int, no_kv_layers: Collection[int]) -> list[int]:
    """The layers that hold KV: every layer but those carrying a state instead (not
    Falcon-H1's, which keep KV beside it), those reading another layer's KV (Gemma 4) and
    those without attention (Llama-Nemotron's)."""
    return [i for i in range(num_layers) if i not in no_kv_layers]


class StepOutput(NamedTuple):
    """The one output of a step that is not KV or state: its name and row width."""

    name: str
    width: int


def step_output(manifest: Manifest) -> StepOutput:
    """`logits` [B, vocab] of a generation bundle, `hidden` [B, hidden_size] of an
    embedding or score bundle (the manifest's task)."""
    if manifest.task in HIDDEN_TASKS:
        return StepOutput(HIDDEN, manifest.model.hidden_size)
    return StepOutput(LOGITS, manifest.model.vocab_size)


class KVPair(NamedTuple):
    """One KV arena: the graph input it is bound to and the output aliasing it."""

    input: str
    output: str


class FileRecord(NamedTuple):
    """A bundle file as the manifest records it."""

    sha256: str
    bytes: int


class GraphIO(NamedTuple):
    """Name -> [dtype, axes], as the manifest stores a graph's inputs and outputs."""

    inputs: dict[str, list[Any]]
    outputs: dict[str, list[Any]]


def step_io(num_layers: int, kv_heads: int, head_dim: int, vocab: int, dtype: str,
            states: Mapping[int, Mapping[str, list[Any]]] | None = None,
            layer_kv: Mapping[int, tuple[int, int]] | None = None,
            shared: Collection[int] = (), kv_state_layers: Collection[int] = (),
            hidden: int | None = None) -> GraphIO:
    """Every input and output of a chunk graph with these dimensions; the layers in
    `states` (layer -> kind -> [dtype, shape]) carry those states instead of KV (those also
    in `kv_state_layers` beside it), those in `layer_kv` (layer -> (kv_heads, head_dim)) KV
    of their own shape, and those in `shared` nothing (they read another layer's KV inside
    the graph). With `hidden` (an embedding bundle's hidden_size) the graph's output is
    `hidden` [batch, hidden] in place of `logits`. (`shared` holds the attention-free
    layers too: a layer without KV tensors is one whatever its reason.)"""
    states, layer_kv = states or {}, layer_kv or {}
    inputs: dict[str, list[Any]] = {
        INPUT_IDS: ["int64", [BATCH, CHUNK]],
        PAST_LENS: ["int32", [BATCH]],
        VALID_LENS: ["int32", [BATCH]],
    }
    outputs: dict[str, list[Any]] = ({LOGITS: ["float32", [BATCH, vocab]]} if hidden is None
                                     else {HIDDEN: ["float32", [BATCH, hidden]]})
    for layer in range(num_layers):
        if layer in states:
            for kind, spec in states[layer].items():
                state = state_names(layer, kind)
                inputs[state.past], outputs[state.present] = spec, spec
            if layer not in kv_state_layers:
                continue
        if layer in shared:
            continue
        heads, dim = layer_kv.get(layer, (kv_heads, head_dim))
        kv = [dtype, [BATCH, heads, CAPACITY, dim]]
        names = kv_names(layer)
        inputs |= {names.past_key: kv, names.past_value: kv}
        outputs |= {names.present_key: kv, names.present_value: kv}
    return GraphIO(inputs, outputs)


def kv_pairs(graph: GraphInfo) -> list[KVPair]:
    """The KV arenas in arena order: layer 0 key, layer 0 value, layer 1 key, ..."""
    inputs = [name for pair in graph.kv_inputs for name in pair]
    outputs = [name for pair in graph.kv_outputs for name in pair]
    return [KVPair(i, o) for i, o in zip(inputs, outputs, strict=True)]


def kv_buffers(graph: GraphInfo, value_is_key: bool = True) -> list[list[KVPair]]:
    """The KV buffers in arena order, each with the (input, output) pairs bound to it: one
    buffer per pair, but one for both pairs of a layer in graph.value_is_key (its value
    cache would repeat its key cache) unless `value_is_key` is False."""
    shared = {kv_names(i).past_key for i in graph.value_is_key} if value_is_key else set()
    buffers: list[list[KVPair]] = []
    for (key_in, value_in), (key_out, value_out) in zip(graph.kv_inputs, graph.kv_outputs,
                                                        strict=True):
        key, value = KVPair(key_in, key_out), KVPair(value_in, value_out)
        buffers += [[key, value]] if key_in in shared else [[key], [value]]
    return buffers


def kv_dims(graph: GraphInfo, buffers: list[list[KVPair]]) -> list[tuple[int, int]]:
    """(kv_heads, head_dim) of each KV buffer (kv_buffers), in arena order, read from the
    graph's inputs (check_graph_io has matched them to the model's dimensions)."""
    return [(int(graph.inputs[pairs[0].input][1][1]), int(graph.inputs[pairs[0].input][1][3]))
            for pairs in buffers]


def state_pairs(graph: GraphInfo) -> list[KVPair]:
    """The recurrent states in layer order: the input read and the output written."""
    return [KVPair(i, o) for i, o in zip(graph.state_inputs, graph.state_outputs,
                                         strict=True)]


def state_slot_bytes(graph: GraphInfo) -> int:
    """Bytes of recurrent state one slot holds: each state input's shape past the batch
    axis, at its own dtype."""
    total = 0
    for name in graph.state_inputs:
        dtype, shape = graph.inputs[name]
        total += math.prod(int(d) for d in shape[1:]) * np.dtype(dtype).itemsize
    return total


def _graph_states(graph: GraphInfo, state_layers: Collection[int]) -> dict[int, dict[str, Any]]:
    """layer -> kind -> [dtype, shape] of the graph's state inputs, the names checked."""
    states: dict[int, dict[str, Any]] = {}
    for name in graph.state_inputs:
        match = STATE_NAME.fullmatch(name)
        if match is None or int(match[2]) not in state_layers or name not in graph.inputs:
            raise BundleError(f"the manifest's state input {name!r} is not the chunk-graph "
                              "contract's (past_conv.{i}/past_recurrent.{i} of a layer in "
                              "model.state_layers); re-export")
        spec = _plain({name: graph.inputs[name]})[name]
        if not spec[1] or spec[1][0] != BATCH:
            raise BundleError(f"the state input {name} must be batch first, got {spec[1]}")
        states.setdefault(int(match[2]), {})[match[1]] = spec
    return states


def file_records(files: Mapping[str, Mapping[str, Any]]) -> dict[str, FileRecord]:
    """The manifest's `files` as typed records."""
    return {name: FileRecord(str(r.get("sha256", "")), int(r.get("bytes", -1)))
            for name, r in files.items()}


def check_graph_io(manifest: Manifest) -> None:
    """Raise BundleError unless the manifest's graph has exactly the contract's inputs,
    outputs and KV pairs for its model's dimensions (its output `logits`, or `hidden`
    where its task is "embed" or "score")."""
    m, graph = manifest.model, manifest.graph
    states = _graph_states(graph, m.state_layers)
    if sorted(states) != list(m.state_layers):
        raise BundleError(f"the manifest's state inputs cover layers {sorted(states)}, not "
                          f"model.state_layers {m.state_layers}; re-export")
    layer_kv = {i: m.kv_dims(i) for i in range(m.num_layers)}
    hidden = m.hidden_size if manifest.task in HIDDEN_TASKS else None
    expected = step_io(m.num_layers, m.num_kv_heads, m.head_dim, m.vocab_size, graph.dtype,
                       states, layer_kv, [*m.shared_kv_layers, *m.attention_free_layers],
                       m.kv_state_layers, hidden)
    _same("inputs", _plain(graph.inputs), expected.inputs)
    _same("outputs", _plain(graph.outputs), expected.outputs)
    layers = [kv_names(i) for i in attention_layers(m.num_layers, m.no_kv_layers)]
    pairs = [p for n in layers for p in (KVPair(n.past_key, n.present_key),
                                         KVPair(n.past_value, n.present_value))]
    if kv_pairs(graph) != pairs:
        raise BundleError("the manifest's KV input/output pairs are not the chunk-graph "
                          "contract's (past_key.{i}/present_key.{i}, ...); re-export")
    expected_pairs = [KVPair(*state_names(i, kind)) for i in m.state_layers
                      for kind in STATE_KINDS if kind in states[i]]
    if state_pairs(graph) != expected_pairs:
        raise BundleError("the manifest's state inputs/outputs are not the chunk-graph "
                          "contract's (past_conv.{i}/present_conv.{i}, "
                          "past_recurrent.{i}/present_recurrent.{i}, in layer order); "
                          "re-export")


def check_loaded_io(manifest: Manifest, inputs: Collection[str], outputs: Collection[str]) -> None:
    """Raise BundleError unless a loaded graph file has exactly the inputs and outputs its
    manifest declares (a graph file swapped or edited after export)."""
    graph = manifest.graph
    for kind, got, declared in (("inputs", inputs, graph.inputs),
                                ("outputs", outputs, graph.outputs)):
        if set(got) != set(declared):
            odd = sorted(set(got) ^ set(declared))
            more = f" and {len(odd) - 4} more" if len(odd) > 4 else ""
            raise BundleError(f"{graph.file} does not match its manifest: the {kind} "
                              f"{', '.join(odd[:4])}{more} differ; re-export the bundle")


def check_graph_file(manifest: Manifest, inputs: Mapping[str, list[Any]],
                     outputs: Mapping[str, list[Any]]) -> None:
    """Raise BundleError unless the graph file declares the manifest's inputs and outputs
    (name -> [dtype, shape]; a shape None where the file gives none): the same names and
    dtypes, and every fixed size the manifest gives where the file fixes one too. Another
    bundle's graph copied in (more KV heads, another vocabulary) fails here, at load,
    rather than at its first call."""
    check_loaded_io(manifest, inputs, outputs)  # the names first
    graph = manifest.graph
    for got, declared in ((inputs, graph.inputs), (outputs, graph.outputs)):
        for name, (dtype, shape) in got.items():
            want_dtype, want_shape = declared[name]
            if dtype != want_dtype or not _same_axes(shape, want_shape):
                raise BundleError(f"{graph.file} does not match its manifest: {name} is "
                                  f"{dtype} {_axes(shape)} in the graph, {want_dtype} "
                                  f"{_axes(want_shape)} in the manifest; re-export the bundle")


def _axes(shape: list[Any] | None) -> str:
    return "[?]" if shape is None else f"[{', '.join(map(str, shape))}]"


def _same_axes(got: list[Any] | None, declared: list[Any]) -> bool:
    """The graph's axes agree with the manifest's: as many, and equal where both fix a
    size (a symbolic axis is named by the exporter only, so names are not compared)."""
    if got is None:
        return True
    return len(got) == len(declared) and all(
        not (isinstance(a, int) and isinstance(b, int)) or a == b
        for a, b in zip(got, declared, strict=True))


def _plain(table: Mapping[str, Any]) -> dict[str, list[Any]]:
    try:
        return {name: [spec[0], list(spec[1])] for name, spec in table.items()}
    except (AttributeError, IndexError, KeyError, TypeError):
        raise BundleError("the manifest's graph inputs/outputs are malformed: each is "
                          "name -> [dtype, shape]") from None


def _same(kind: str, got: dict[str, list[Any]], expected: dict[str, list[Any]]) -> None:
    if got == expected:
        return
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(got) & set(expected) if got[n] != expected[n])
    detail = "; ".join(part for part in (
        f"missing {', '.join(missing)}" if missing else "",
        f"unexpected {', '.join(extra)}" if extra else "",
        ", ".join(f"{n} is {got[n]}, expected {expected[n]}" for n in wrong[:3]),
    ) if part)
    raise BundleError(f"the bundle's graph {kind} differ from the chunk-graph contract: "
                      f"{detail}; re-export it with `edgeprefill export`")
