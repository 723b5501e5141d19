"""RWKV-4's blocks (transformers' RwkvBlock, in eval mode) as stock ONNX ops, with their
two states.

  time mix     h = ln1(x), s = the h of the token before           state 1, row 0
               k, v = key(h mu_k + s (1 - mu_k)), value(h mu_v + s (1 - mu_v))
               r = sigmoid(receptance(h mu_r + s (1 - mu_r)))
               wkv per channel, float32, from num, den and p         state 2 (num, den, p)
                 q = max(p, u + k)       out = (e^(p-q) num + e^(u+k-q) v)
                                             / (e^(p-q) den + e^(u+k-q))
                 q' = max(p + w, k)      num = e^(p+w-q') num + e^(k-q') v
                 den = e^(p+w-q') den + e^(k-q')                     p = q'
               (u = time_first, w = -exp(time_decay))
               x += output(r * wkv) / 2^(i // rescale_every)
  channel mix  h = ln2(x), s = the h of the token before           state 1, row 1
               x += sigmoid(receptance(h mu_r + s (1 - mu_r)))
                    * value(relu(key(h mu_k + s (1 - mu_k)))^2) / 2^(i // rescale_every)
  rescale      x / 2 after every rescale_every-th layer

transformers divides the output and value weights by that power of two at its first eval
forward (RwkvModel._rescale_layers); the graph divides their outputs, which is the same
in floats (a power of two scales exactly) and leaves the weights, quantized or not, as
stored.

States, batch first: `conv` [2, hidden] in the model's dtype, the last valid token's h of
the time mix and of the channel mix (transformers' state[1] and state[0]); `recurrent`
[3, attention_hidden] float32, num, den and p (its state[2:5]). A row's first chunk reads
zeros and p = -1e38 (transformers' first forward: nothing before it weighs anything);
padding leaves the WKV state as it is and the shift state is the last valid token's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

F32 = np.dtype(np.float32)
# p where nothing came before: every weight e^(p - q) of the empty past is 0
NO_PAST = -1e38

Norm = Callable[[str, str], str]  # (x, module) -> the model's LayerNorm of x


class Rwkv(RecurrentMixer):
    """Emits RWKV-4 blocks; the values they all share are computed once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str, norm: Norm) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        self.norm = norm
        hidden = cfg.hidden_size
        # [B, 1, 1] and [B, 1] bool: the row continues a sequence (else its states read as
        # a sequence's start)
        self.row_continues = g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(
            0, np.int32)]), g.const([1, 2])])
        self.row_continues_2d = g.op("Squeeze", [self.row_continues, g.const([2])])
        # [B, 1, hidden]: where the last valid token's h lies in [state, h_0, ..., h_C-1]
        last = g.op("Unsqueeze", [g.op("Cast", [valid_lens], to=7), g.const([1, 2])])
        self.last_index = g.op("Expand", [last, g.const([1, 1, hidden])])

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's token-shift state (model dtype) and WKV state (float32)."""
        return [(state_names(layer, CONV), self.w.dtype, [BATCH, 2, self.cfg.hidden_size]),
                (state_names(layer, RECURRENT), F32, [BATCH, 3, self.cfg.hidden_size])]

    def layer(self, p: str, x: str, layer: int, rows) -> str:
        """Block `layer` (prefix `p`) on the residual stream `x`; returns the stream after
        it, of the tokens `rows` keeps."""
        g, names = self.g, self.cfg.names
        self._check_shapes(p)
        shift = state_names(layer, CONV)
        time_past, channel_past = g.op("Split", [shift.past], 2, axis=1, num_outputs=2)
        att, time_last = self._time_mix(p + "attention.", layer,
                                        self.norm(x, p + names.input_norm), time_past)
        x = g.op("Add", [x, self._rescaled(att, layer)])
        h = self.norm(x, p + names.post_attn_norm)
        shifted, channel_last = self._shift(h, channel_past)
        ffn = self._channel_mix(p + "feed_forward.", rows(h), rows(shifted))
        g.op("Concat", [time_last, channel_last], [shift.present], axis=1)
        x = g.op("Add", [rows(x), self._rescaled(ffn, layer)])
        every = self.cfg.rescale_every
        if every and (layer + 1) % every == 0:
            x = g.op("Div", [x, g.const(2.0, self.w.dtype)])
        return x

    def _time_mix(self, pre: str, layer: int, h: str, past: str) -> tuple[str, str]:
        """The time mix's output on every token of `h` (ln1's), and its shift state's new
        value [B, 1, hidden]."""
        g, width = self.g, self.cfg.hidden_size
        shifted, last = self._shift(h, past)
        key = self.w.linear(self._mixed(pre, "key", h, shifted), [pre + "key.weight"], None)
        value = self.w.linear(self._mixed(pre, "value", h, shifted), [pre + "value.weight"],
                              None)
        receptance = g.op("Sigmoid", [self.w.linear(self._mixed(pre, "receptance", h, shifted),
                                                    [pre + "receptance.weight"], None)])
        k, v = (self.tokens.spread(self._float(t)) for t in (key, value))
        wkv = self.tokens.gather(self._wkv(pre, layer, k, v), width)  # float32
        out = g.op("Mul", [receptance, self._cast(wkv, self.w.dtype)])
        return self.w.linear(out, [pre + "output.weight"], None), last

    def _channel_mix(self, pre: str, h: str, shifted: str) -> str:
        g = self.g
        key = self.w.linear(self._mixed(pre, "key", h, shifted), [pre + "key.weight"], None)
        relu = g.op("Relu", [key])
        value = self.w.linear(g.op("Mul", [relu, relu]), [pre + "value.weight"], None)
        receptance = g.op("Sigmoid", [self.w.linear(self._mixed(pre, "receptance", h, shifted),
                                                    [pre + "receptance.weight"], None)])
        return g.op("Mul", [receptance, value])

    def _shift(self, h: str, past: str) -> tuple[str, str]:
        """(the h of the token before each token of `h`, as `h` is laid out; the new shift
        state [B, 1, hidden]: the row's last valid h). `past` [B, 1, hidden] is the state
        read, zeros where the row starts."""
        g = self.g
        kept = g.op("Where", [self.row_continues, past, g.const(0.0, self.w.dtype)])
        full = g.op("Concat", [kept, self.tokens.spread(h)], axis=1)  # [B, 1 + C, hidden]
        before = g.op("Slice", [full, g.const([0]), g.const([-1]), g.const([1])])
        last = g.op("GatherElements", [full, self.last_index], axis=1)
        return self.tokens.gather(before, self.cfg.hidden_size), last

    def _mixed(self, pre: str, kind: str, h: str, shifted: str) -> str:
        """h mu + shifted (1 - mu), mu the module's time_mix_{kind} (stored [1, 1, hidden],
        read flat: `h` may be [B, hidden], the last layer's last tokens)."""
        g, name, dtype = self.g, pre + f"time_mix_{kind}", self.w.dtype
        width = (self.cfg.hidden_size,)
        mix = g.weight(name + ".flat", width, dtype,
                       lambda: self.w.ckpt.get(name, dtype).reshape(width))
        complement = g.weight(name + ".complement", width, dtype, lambda: (
            1.0 - self.w.ckpt.get(name, np.float32)).reshape(width).astype(dtype))
        return g.op("Add", [g.op("Mul", [h, mix]), g.op("Mul", [shifted, complement])])

    def _wkv(self, pre: str, layer: int, k: str, v: str) -> str:
        """[B, C, hidden] float32: the WKV of keys and values `k`, `v` [B, C, hidden]
        (float32) from the layer's state, its new value written to the state's present
        output."""
        g, width = self.g, self.cfg.hidden_size
        first = self._f32(pre + "time_first", lambda t: t)
        decay = self._f32(pre + "time_decay", lambda t: -np.exp(t))
        state = state_names(layer, RECURRENT)
        num, den, p = (g.op("Squeeze", [part, g.const([1])]) for part in g.op(
            "Split", [state.past], 3, axis=1, num_outputs=3))
        zero = g.const(0.0, np.float32)
        num, den = (g.op("Where", [self.row_continues_2d, t, zero]) for t in (num, den))
        p = g.op("Where", [self.row_continues_2d, p, g.const(NO_PAST, np.float32)])
        first_k = g.op("Add", [k, first])
        decays = g.op("Expand", [decay, g.op("Shape", [k])])
        num, den, p, out = g.op("Scan", [num, den, p, k, v, first_k, decays, self.valid], 4,
                                num_scan_inputs=5, scan_input_axes=[1] * 5,
                                scan_output_axes=[1], body=_wkv_body(f"wkv{layer}_", width))
        g.op("Concat", [g.op("Unsqueeze", [t, g.const([1])]) for t in (num, den, p)],
             [state.present], axis=1)
        return out

    def _rescaled(self, x: str, layer: int) -> str:
        """x / 2^(layer // rescale_every): the output of a weight transformers divides so."""
        every = self.cfg.rescale_every
        if not every or layer < every:
            return x
        return self.g.op("Div", [x, self.g.const(2.0 ** (layer // every), self.w.dtype)])

    def _f32(self, name: str, transform: Callable[[np.ndarray], np.ndarray]) -> str:
        """A checkpoint vector kept in float32 (transformers keeps time_first and
        time_decay so), transformed."""
        return self.g.weight(name + ".f32", (self.cfg.hidden_size,), np.float32,
                             lambda: transform(self.w.ckpt.get(name, np.float32))
                             .astype(np.float32))

    def _check_shapes(self, p: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        hidden, inner = self.cfg.hidden_size, self.cfg.intermediate_size
        att, ffn = p + "attention.", p + "feed_forward."
        mix = (1, 1, hidden)
        self.w.check_shapes((
            *((att + m + ".weight", (hidden, hidden)) for m in ("key", "value", "receptance",
                                                                 "output")),
            (att + "time_decay", (hidden,)), (att + "time_first", (hidden,)),
            *((att + f"time_mix_{m}", mix) for m in ("key", "value", "receptance")),
            (ffn + "key.weight", (inner, hidden)), (ffn + "value.weight", (hidden, inner)),
            (ffn + "receptance.weight", (hidden, hidden)),
            *((ffn + f"time_mix_{m}", mix) for m in ("key", "receptance"))),
            f"hidden_size {hidden}, intermediate_size {inner}")


def _wkv_body(prefix: str, width: int) -> Any:
    """The Scan's body, one token, float32 [B, width] (transformers'
    rwkv_linear_attention_cpu step by step): the WKV output, and num, den and p updated
    where the token is valid (kept as they are on padding)."""
    body = GraphBuilder(prefix)
    shape = [BATCH, width]
    num = body.input(prefix + "num", F32, shape)
    den = body.input(prefix + "den", F32, shape)
    p = body.input(prefix + "p", F32, shape)
    k = body.input(prefix + "k", F32, shape)
    v = body.input(prefix + "v", F32, shape)
    first_k = body.input(prefix + "first_k", F32, shape)  # u + k
    decay = body.input(prefix + "decay", F32, shape)  # w
    valid = body.input(prefix + "valid", np.bool_, [BATCH, 1])

    def weighted(before: str, now: str) -> tuple[str, str]:
        """(e1 num + e2 v, e1 den + e2): the past at `before`, this token at `now`."""
        top = body.op("Max", [before, now])
        e1 = body.op("Exp", [body.op("Sub", [before, top])])
        e2 = body.op("Exp", [body.op("Sub", [now, top])])
        return (body.op("Add", [body.op("Mul", [e1, num]), body.op("Mul", [e2, v])]),
                body.op("Add", [body.op("Mul", [e1, den]), e2]))

    top, bottom = weighted(p, first_k)
    body.op("Div", [top, bottom], [prefix + "out"])
    later = body.op("Add", [p, decay])
    new_num, new_den = weighted(later, k)
    new_p = body.op("Max", [later, k])
    for name, new, old in (("num_out", new_num, num), ("den_out", new_den, den),
                           ("p_out", new_p, p)):
        body.op("Where", [valid, new, old], [prefix + name])
    for name in ("num_out", "den_out", "p_out", "out"):
        body.output(prefix + name, F32, shape)
    return body.to_graph(prefix + "step")
