"""ONNX operators that TensorRT's ONNX parser imports, for the TensorRT version we target.

Source: onnx-tensorrt `docs/operators.md` as released with TensorRT 10.15 (header: "TensorRT
10.15 supports operators in the inclusive range of opset 9 to opset 24"). The table below is
transcribed from that file (read through an indexed copy of the document, not checked out
from a tagged clone here): every operator marked `Y`, with the restriction text trimmed to
what can matter for a decoder graph. Operators marked `N` are absent. Re-check this table
when raising MIN_TENSORRT.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

MIN_TENSORRT = (10, 15)  # TensorScatter is imported as IKVCacheUpdateLayer from 10.15 on
SOURCE = "onnx-tensorrt docs/operators.md, TensorRT 10.15 release"
MAX_OPSET = 24

# op_type -> restriction ("" when the document lists none).
SUPPORTED_OPS: dict[str, str] = {
    **{op: "" for op in (
        "Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh BatchNormalization "
        "BlackmanWindow Cast CastLike Ceil Celu Clip Concat ConstantOfShape Conv ConvTranspose "
        "Cos Cosh DepthToSpace Div Einsum Elu Equal Erf Exp Expand Flatten Floor Gather "
        "GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater "
        "GreaterOrEqual GroupNormalization HammingWindow HannWindow HardSigmoid HardSwish "
        "Identity ImageScaler InstanceNormalization IsInf IsNaN LeakyRelu Less LessOrEqual Log "
        "LogSoftmax LRN LpNormalization MatMul Max Mean MeanVarianceNormalization Min Mish Mod "
        "Mul Neg NonMaxSuppression NonZero Not Or Pad ParametricSoftplus Pow PRelu Range "
        "Reciprocal Relu Reshape ReverseSequence RMSNormalization RNN RoiAlign Round ScaledTanh "
        "Scan Scatter ScatterElements Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice "
        "Softmax Softplus Softsign SpaceToDepth Split Sqrt Sub Sum Tan Tanh ThresholdedRelu "
        "Tile Transpose Trilu Upsample Where Xor"
    ).split()},
    "Attention": "Q, K, V 4D; past_key/past_value/present outputs unsupported",
    "AveragePool": "2D or 3D pooling only",
    "Constant": "sparse_value and string values unsupported",
    "CumSum": "axis must be a build-time constant",
    "DeformConv": "1D or 2D spatial input",
    "DequantizeLinear": "x_zero_point must be zero",
    "Dropout": "is_training must be an initializer evaluating to False",
    "EyeLike": "input must have static dimensions",
    "GridSample": "4D input",
    "GRU": "bidirectional: same activations both ways",
    "Hardmax": "axis dimension must be a build-time constant",
    "If": "branch outputs must have the same rank and different names",
    "LayerNormalization": "only the first output Y",
    "Loop": "scan output length cannot be dynamic",
    "LpPool": "dilations empty or all ones",
    "LSTM": "input_forget=0, layout=0",
    "MaxPool": "2D or 3D; no Indices output",
    "OneHot": "depth must be a build-time constant",
    "QuantizeLinear": "y_zero_point must be 0",
    "RandomNormal": "seed ignored",
    "RandomNormalLike": "seed ignored",
    "RandomUniform": "seed ignored",
    "RandomUniformLike": "seed ignored",
    **{f"Reduce{k}": "axes must be an initializer" for k in (
        "L1", "L2", "LogSum", "LogSumExp", "Max", "Mean", "Min", "Prod", "Sum", "SumSquare"
    )},
    "Resize": "nearest/linear modes only; no antialiasing",
    "RotaryEmbedding": "position_ids must be INT64",
    "ScatterND": "reduction must be none",
    "Squeeze": "axes must be resolvable to a constant",
    "STFT": "frame_step and window must be initializers",
    "TensorScatter": "past_cache and update must be 4D; axis must be -2",
    "TopK": "sorted=1; K < 3840",
    "Unsqueeze": "axes must be resolvable to a constant",
}

# Inputs that the restrictions above require to be constants (initializers), by op type.
CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    **{f"Reduce{k}": (1,) for k in (
        "L1", "L2", "LogSum", "LogSumExp", "Max", "Mean", "Min", "Prod", "Sum", "SumSquare"
    )},
    "Squeeze": (1,),
    "Unsqueeze": (1,),
}


def unsupported_ops(op_types: Iterable[str]) -> list[str]:
    """The op types TensorRT's ONNX parser cannot import, sorted."""
    return sorted({op for op in op_types if op not in SUPPORTED_OPS})


def restriction_problems(model: onnx.ModelProto) -> list[str]:
    """Nodes that break a parser restriction this graph could plausibly hit."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in graph.input}
    outputs = {v.name for v in graph.output}
    problems = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"{node.name}: custom-domain op {node.domain}.{node.op_type}")
        for index in CONSTANT_INPUTS.get(node.op_type, ()):
            if len(node.input) > index and node.input[index] not in constants:
                problems.append(f"{node.name}: {node.op_type} input {index} must be a constant")
        if node.op_type == "TensorScatter":
            problems += _tensor_scatter_problems(node, ranks, outputs)
        reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "none")
        if node.op_type == "ScatterND" and reduction != "none":
            problems.append(f"{node.name}: ScatterND reduction {reduction!r}, TensorRT needs "
                            "'none'")
    return problems


def _tensor_scatter_problems(
    node: onnx.NodeProto, ranks: dict[str, int], outputs: set[str]
) -> list[str]:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -2)
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "linear")
    problems = []
    if axis != -2:
        problems.append(f"{node.name}: TensorScatter axis is {axis}, TensorRT needs -2")
    if mode != "linear":
        problems.append(f"{node.name}: TensorScatter mode {mode!r}, TensorRT needs 'linear'")
    if ranks.get(node.input[0]) != 4:
        # IKVCacheUpdateLayer: the cache must be a 4D network input, updated in place.
        problems.append(f"{node.name}: the TensorScatter cache must be a 4D graph input")
    if node.output[0] not in outputs:
        problems.append(f"{node.name}: the updated cache must be a graph output")
    return problems
