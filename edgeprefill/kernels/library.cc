// The library's entry point (RegisterCustomOps) and what its ops share: tensor access
// through the C API, the pool, and the OrtCustomOp table. Nothing from ONNX Runtime is
// linked: the API table comes from the OrtApiBase passed to RegisterCustomOps.

#include "kernel_common.h"

#include <algorithm>
#include <string>
#include <utility>

namespace edgeprefill {

const OrtApi* g_api = nullptr;

namespace {

OrtStatus* Describe(const OrtValue* value, Tensor* tensor) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  EP_RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  size_t count = 0;
  OrtStatus* status = g_api->GetTensorElementType(info, &tensor->type);
  if (status == nullptr) status = g_api->GetDimensionsCount(info, &count);
  if (status == nullptr) {
    tensor->dims.resize(count);
    status = g_api->GetDimensions(info, tensor->dims.data(), count);
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  EP_RETURN_IF_ERROR(status);
  void* data = nullptr;
  EP_RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  tensor->data = static_cast<float*>(data);
  return nullptr;
}

const OpSpec& SpecOf(const OrtCustomOp* op) { return reinterpret_cast<const Op*>(op)->spec; }

OrtStatus* ORT_API_CALL CreateKernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                     void** kernel) {
  return SpecOf(op).create(info, kernel);
}
const char* ORT_API_CALL Name(const OrtCustomOp* op) { return SpecOf(op).name; }
const char* ORT_API_CALL Provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
size_t ORT_API_CALL InputCount(const OrtCustomOp* op) { return SpecOf(op).inputs; }
size_t ORT_API_CALL OutputCount(const OrtCustomOp* op) { return SpecOf(op).outputs; }
ONNXTensorElementDataType ORT_API_CALL InputType(const OrtCustomOp* op, size_t index) {
  if ((SpecOf(op).any_inputs >> index) & 1u) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if ((SpecOf(op).uint8_inputs >> index) & 1u) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  if ((SpecOf(op).uint16_inputs >> index) & 1u) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
  return (SpecOf(op).int32_inputs >> index) & 1u ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
                                                  : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL OutputType(const OrtCustomOp* op, size_t index) {
  return (SpecOf(op).uint16_outputs >> index) & 1u ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16
                                                   : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL OutputRequired(const OrtCustomOp* op, size_t index) {
  return (SpecOf(op).optional_outputs >> index) & 1u ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL InputRequired(const OrtCustomOp* op, size_t index) {
  return (SpecOf(op).optional_inputs >> index) & 1u ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL MemoryType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL One(const OrtCustomOp*) { return 1; }

}  // namespace

OrtStatus* CreateAttentionKernel(const OrtKernelInfo* info, const char* op, void** kernel) {
  int64_t heads = 0, kv_heads = 0;
  float scale = 0.0f;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "num_heads", &heads));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv_heads));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_float(info, "scale", &scale));
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    return Fail((std::string(op) + ": num_heads must be a positive multiple of kv_num_heads").c_str());
  int64_t bf16 = 0, packed = 0, last = 0, window = 0, interleaved = 0;  // absent means 0
  for (auto [name, value] : {std::pair{"bf16", &bf16}, std::pair{"packed", &packed},
                             std::pair{"last", &last}, std::pair{"local_window_size", &window},
                             std::pair{"rotary_interleaved", &interleaved}}) {
    OrtStatus* missing = g_api->KernelInfoGetAttribute_int64(info, name, value);
    if (missing != nullptr) g_api->ReleaseStatus(missing);
  }
  float softcap = 0.0f;  // optional: absent or 0 is none
  OrtStatus* uncapped = g_api->KernelInfoGetAttribute_float(info, "softcap", &softcap);
  if (uncapped != nullptr) g_api->ReleaseStatus(uncapped);
  if (softcap < 0.0f) return Fail((std::string(op) + ": softcap must not be negative").c_str());
  if (last != 0 && packed == 0)
    return Fail((std::string(op) + ": last=1 needs packed=1").c_str());
  // GroupQueryAttention's local_window_size: -1 (its default) or 0 is no window.
  *kernel = new Kernel{heads, kv_heads, scale, bf16 != 0, false, packed != 0, last != 0,
                       std::max<int64_t>(window, 0), softcap, interleaved != 0};
  return nullptr;
}

OrtStatus* Input(OrtKernelContext* context, size_t index, Tensor* tensor) {
  const OrtValue* value = nullptr;
  EP_RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &value));
  return Describe(value, tensor);
}

OrtStatus* HasInput(OrtKernelContext* context, size_t index, bool* has) {
  size_t count = 0;
  EP_RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &count));
  const OrtValue* given = nullptr;
  if (count > index) EP_RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &given));
  *has = given != nullptr;
  return nullptr;
}

OrtStatus* RotaryInputs(OrtKernelContext* context, size_t index, int64_t d, const char* op,
                        RotaryTables* tables) {
  bool has_cos = false, has_sin = false;
  EP_RETURN_IF_ERROR(HasInput(context, index, &has_cos));
  EP_RETURN_IF_ERROR(HasInput(context, index + 1, &has_sin));
  if (has_cos != has_sin)
    return Fail((std::string(op) + ": cos and sin must be given both or neither").c_str());
  if (!has_cos) {
    *tables = {nullptr, nullptr, 0, INT64_MAX};
    return nullptr;
  }
  Tensor cos, sin;
  EP_RETURN_IF_ERROR(Input(context, index, &cos));
  EP_RETURN_IF_ERROR(Input(context, index + 1, &sin));
  if (cos.dims.size() != 2 || cos.dims != sin.dims || cos.dims[1] < 1 || cos.dims[1] * 2 > d)
    return Fail((std::string(op) +
                 ": cos and sin must be [positions, rotary_dim / 2], rotary_dim <= head_dim").c_str());
  *tables = {cos.data, sin.data, 2 * cos.dims[1], cos.dims[0]};
  return nullptr;
}

OrtStatus* SinkInput(OrtKernelContext* context, size_t index, int64_t heads, const char* op,
                     const float** sink) {
  bool given = false;
  EP_RETURN_IF_ERROR(HasInput(context, index, &given));
  *sink = nullptr;
  if (!given) return nullptr;
  Tensor t;
  EP_RETURN_IF_ERROR(Input(context, index, &t));
  if (t.dims.size() != 1 || t.dims[0] != heads)
    return Fail((std::string(op) + ": head_sink must be [num_heads]").c_str());
  *sink = t.data;
  return nullptr;
}

OrtStatus* Output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& dims,
                  float** data) {
  OrtValue* value = nullptr;
  EP_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, index, dims.data(), dims.size(), &value));
  void* raw = nullptr;
  EP_RETURN_IF_ERROR(g_api->GetTensorMutableData(value, &raw));
  *data = static_cast<float*>(raw);
  return nullptr;
}

void ParallelFor(OrtKernelContext* context, void (*fn)(void*, size_t), size_t count, void* data) {
  if (count <= 1) {  // nothing to hand out
    for (size_t i = 0; i < count; ++i) fn(data, i);
    return;
  }
  OrtStatus* pooled = g_api->KernelContext_ParallelFor(context, fn, count, 0, data);
  if (pooled != nullptr) {  // no pool available: run the pieces here
    g_api->ReleaseStatus(pooled);
    for (size_t i = 0; i < count; ++i) fn(data, i);
  }
}

namespace {

constexpr int64_t kRowsPerBlock = 16;  // a prefill chunk's rows split over the pool
constexpr int64_t kParallelFloats = 1 << 15;  // below this the pool's hand-out costs more

struct RowBlocks {
  int64_t rows;
  void (*run)(void*, int64_t, int64_t);
  void* job;
};

void RunRowBlock(void* data, size_t index) {
  const RowBlocks& blocks = *static_cast<const RowBlocks*>(data);
  const int64_t first = static_cast<int64_t>(index) * kRowsPerBlock;
  blocks.run(blocks.job, first, std::min(blocks.rows, first + kRowsPerBlock));
}

}  // namespace

void ForRowBlocks(OrtKernelContext* context, int64_t rows, int64_t width,
                  void (*run)(void* job, int64_t first, int64_t last), void* job) {
  RowBlocks blocks{rows, run, job};
  const int64_t count = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (count > 1 && rows * width >= kParallelFloats)
    ParallelFor(context, RunRowBlock, static_cast<size_t>(count), &blocks);
  else
    for (int64_t i = 0; i < count; ++i) RunRowBlock(&blocks, static_cast<size_t>(i));
}

void ProjectRows(OrtKernelContext* context, bool split, int64_t rows,
                 void (*prepare)(void*, size_t), size_t pieces, void (*piece)(void*, size_t),
                 void* job) {
  const size_t prepares =
      prepare == nullptr ? 0 : static_cast<size_t>((rows + kPrepareRows - 1) / kPrepareRows);
  if (split && prepares > 1)
    ParallelFor(context, prepare, prepares, job);
  else
    for (size_t i = 0; i < prepares; ++i) prepare(job, i);
  if (split && pieces > 1)
    ParallelFor(context, piece, pieces, job);
  else
    for (size_t i = 0; i < pieces; ++i) piece(job, i);
}

OrtStatus* RowsOutput(OrtKernelContext* context, const Tensor& a, int64_t width, float** out,
                      int64_t* rows) {
  std::vector<int64_t> dims = a.dims;
  dims.back() = width;
  EP_RETURN_IF_ERROR(Output(context, 0, dims, out));
  *rows = 1;
  for (size_t i = 0; i + 1 < a.dims.size(); ++i) *rows *= a.dims[i];
  return nullptr;
}

OrtStatus* ReadColumns(const OrtKernelInfo* info, const char* op, Columns* columns) {
  int64_t n = 0;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "N", &n));
  if (n <= 0) return Fail((std::string(op) + ": N must be positive").c_str());
  int64_t gated = 0;  // optional: absent means 0
  OrtStatus* missing = g_api->KernelInfoGetAttribute_int64(info, "gated", &gated);
  if (missing != nullptr) g_api->ReleaseStatus(missing);
  if (gated != 0 && n % (2 * kGatedPanel) != 0)
    return Fail((std::string(op) + ": gated=1 needs N = 2 x a multiple of " +
                 std::to_string(kGatedPanel) + " (gate and up in whole panels), not " +
                 std::to_string(n)).c_str());
  float epsilon = 0.0f;  // optional: present, the norm before the product runs inside
  missing = g_api->KernelInfoGetAttribute_float(info, "epsilon", &epsilon);
  const bool norm = missing == nullptr;
  if (missing != nullptr) g_api->ReleaseStatus(missing);
  if (norm && !(epsilon >= 0.0f))
    return Fail((std::string(op) + ": epsilon must be >= 0").c_str());
  *columns = Columns{n, gated != 0, norm, epsilon};
  return nullptr;
}

OrtStatus* CreateColumnsKernel(const OrtKernelInfo* info, const char* op, void** kernel) {
  Columns columns;
  EP_RETURN_IF_ERROR(ReadColumns(info, op, &columns));
  *kernel = new Columns(columns);
  return nullptr;
}

OrtStatus* NormInputs(OrtKernelContext* context, const Columns& columns, const Tensor& a,
                      size_t index, const char* op, NormRows* norm) {
  bool skip_given = false;
  EP_RETURN_IF_ERROR(HasInput(context, index, &skip_given));
  size_t outputs = 0;
  EP_RETURN_IF_ERROR(g_api->KernelContext_GetOutputCount(context, &outputs));
  if (!columns.norm) {
    if (skip_given || outputs > 1)
      return Fail(
          (std::string(op) + ": skip, gamma and output 1 need the epsilon attribute").c_str());
    return nullptr;
  }
  Tensor skip, gamma;
  bool gamma_given = false;
  EP_RETURN_IF_ERROR(HasInput(context, index + 1, &gamma_given));
  if (!skip_given || !gamma_given || outputs < 2)
    return Fail(
        (std::string(op) + ": epsilon needs the inputs skip and gamma and output 1").c_str());
  EP_RETURN_IF_ERROR(Input(context, index, &skip));
  EP_RETURN_IF_ERROR(Input(context, index + 1, &gamma));
  if (skip.dims != a.dims || gamma.dims != std::vector<int64_t>{a.dims.back()})
    return Fail(
        (std::string(op) + ": skip must have x's shape [..., K] and gamma be [K]").c_str());
  norm->skip = skip.data;
  norm->gamma = gamma.data;
  norm->epsilon = columns.epsilon;
  return Output(context, 1, a.dims, &norm->sum);
}

void ORT_API_CALL DestroyColumnsKernel(void* kernel) { delete static_cast<Columns*>(kernel); }

OrtStatus* CreateStatelessKernel(const OrtKernelInfo*, void** kernel) {
  *kernel = nullptr;  // no attributes, no state
  return nullptr;
}

void ORT_API_CALL DestroyStatelessKernel(void*) {}

Op MakeOp(const OpSpec& spec) {
  Op op;
  std::memset(&op.table, 0, sizeof op.table);
  op.spec = spec;
  OrtCustomOp& t = op.table;
  t.version = kApiVersion;
  t.GetName = Name;
  t.GetExecutionProviderType = Provider;
  t.GetInputType = InputType;
  t.GetInputTypeCount = InputCount;
  t.GetOutputType = OutputType;
  t.GetOutputTypeCount = OutputCount;
  t.KernelDestroy = spec.destroy;
  t.GetInputCharacteristic = InputRequired;
  t.GetOutputCharacteristic = OutputRequired;
  t.GetInputMemoryType = MemoryType;
  t.GetVariadicInputMinArity = One;
  t.GetVariadicInputHomogeneity = One;
  t.GetVariadicOutputMinArity = One;
  t.GetVariadicOutputHomogeneity = One;
  t.CreateKernelV2 = CreateKernel;
  t.KernelComputeV2 = spec.compute;
  t.GetStartVersion = One;
  t.GetEndVersion = One;
  return op;
}

}  // namespace edgeprefill

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace edgeprefill;
  g_api = api_base->GetApi(kApiVersion);
  if (g_api == nullptr) return nullptr;  // cannot even report: ORT older than 1.17
  OrtCustomOpDomain* domain = nullptr;
  // The domain must outlive every session that uses it: it is never released.
  EP_RETURN_IF_ERROR(g_api->CreateCustomOpDomain("edgeprefill", &domain));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &DecodeAttentionOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &PrefillAttentionOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &PrefillAttentionBf16KvOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &SwiGluOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &SkipRmsNormOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &MatMulBf16Op().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &MatMulF32Op().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &MatMulInt4Op().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &MatMulInt8Op().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &GatedDeltaRuleOp().table));
  EP_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &Mamba2ScanOp().table));
  return g_api->AddCustomOpDomain(options, domain);
}
