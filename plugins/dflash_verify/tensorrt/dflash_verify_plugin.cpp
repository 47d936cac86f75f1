// TensorRT IPluginV3 "DFlashVerify" v1 over dfv::launch_verify; see dflash_verify_plugin.h.
#include "dflash_verify_plugin.h"

#include <cstring>
#include <new>
#include <utility>

#include "dflash_verify/verify.h"

namespace dfv_trt {
namespace {

using nvinfer1::DataType;

nvinfer1::ILoggerFinder* g_logger_finder = nullptr;

void log_error(const char* msg) noexcept {
  nvinfer1::ILogger* logger = g_logger_finder ? g_logger_finder->findLogger() : nullptr;
  if (logger != nullptr) logger->log(nvinfer1::ILogger::Severity::kERROR, msg);
}

bool is_ids(DataType t) { return t == DataType::kINT32 || t == DataType::kINT64; }

int32_t id_bytes(DataType t) { return t == DataType::kINT64 ? 8 : 4; }

// Which data types input/output `pos` accepts; outputs 0 and 2 follow the drafts' ids type.
bool type_ok(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* io) {
  const DataType t = io[pos].desc.type;
  switch (pos) {
    case 0: return t == DataType::kFLOAT || t == DataType::kHALF || t == DataType::kBF16;
    case 1: case 2: case 4: return is_ids(t);
    case 3: case 5: return t == DataType::kFLOAT;
    case 6: return t == DataType::kINT64;
    case 7: case 9: return t == io[1].desc.type;
    case 8: return t == DataType::kINT32;
    default: return false;
  }
}

int32_t logits_dtype(DataType t) {
  if (t == DataType::kHALF) return dfv::kFloat16;
  if (t == DataType::kBF16) return dfv::kBFloat16;
  return dfv::kFloat32;
}

// mask_token_id from a field collection (int32 or int64); false if malformed.
bool read_mask_token_id(const nvinfer1::PluginFieldCollection* fc, int64_t& out) {
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const nvinfer1::PluginField& f = fc->fields[i];
    if (f.name == nullptr || std::strcmp(f.name, "mask_token_id") != 0) continue;
    if (f.data == nullptr || f.length != 1) return false;
    if (f.type == nvinfer1::PluginFieldType::kINT64) {
      out = *static_cast<const int64_t*>(f.data);
    } else if (f.type == nvinfer1::PluginFieldType::kINT32) {
      out = *static_cast<const int32_t*>(f.data);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

DFlashVerifyPlugin::DFlashVerifyPlugin(int64_t mask_token_id, std::string plugin_namespace)
    : mask_token_id_(mask_token_id), namespace_(std::move(plugin_namespace)) {}

nvinfer1::IPluginCapability* DFlashVerifyPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept {
  switch (type) {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
  }
  return nullptr;
}

nvinfer1::IPluginV3* DFlashVerifyPlugin::clone() noexcept {
  return new (std::nothrow) DFlashVerifyPlugin(mask_token_id_, namespace_);
}

int32_t DFlashVerifyPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                                            const nvinfer1::DynamicPluginTensorDesc*, int32_t nb_outputs) noexcept {
  if (nb_inputs != kNbInputs || nb_outputs != kNbOutputs) {
    log_error("DFlashVerify: expects 7 inputs (logits, drafts, start, temperature, top_k, top_p, seed), 3 outputs");
    return 1;
  }
  const int32_t ranks[kNbInputs] = {3, 2, 1, 1, 1, 1, 1};
  for (int32_t i = 0; i < kNbInputs; ++i) {
    if (in[i].desc.dims.nbDims != ranks[i]) {
      log_error("DFlashVerify: wrong input rank (logits [B, K+1, V], drafts [B, K], the rest [B])");
      return 1;
    }
  }
  return 0;
}

int32_t DFlashVerifyPlugin::getOutputDataTypes(DataType* output_types, int32_t nb_outputs,
                                               const DataType* input_types, int32_t nb_inputs) const noexcept {
  if (nb_outputs != kNbOutputs || nb_inputs != kNbInputs) return 1;
  output_types[0] = input_types[1];
  output_types[1] = DataType::kINT32;
  output_types[2] = input_types[1];
  return 0;
}

int32_t DFlashVerifyPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                                            const nvinfer1::DimsExprs*, int32_t, nvinfer1::DimsExprs* outputs,
                                            int32_t nb_outputs, nvinfer1::IExprBuilder&) noexcept {
  if (nb_inputs != kNbInputs || nb_outputs != kNbOutputs || inputs[0].nbDims != 3) return 1;
  outputs[0].nbDims = 2;  // tokens [B, K+1]
  outputs[0].d[0] = inputs[0].d[0];
  outputs[0].d[1] = inputs[0].d[1];
  outputs[1].nbDims = 1;  // accepted [B]
  outputs[1].d[0] = inputs[0].d[0];
  outputs[2] = outputs[0];  // next_block_ids [B, K+1]
  return 0;
}

bool DFlashVerifyPlugin::supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out,
                                                   int32_t nb_inputs, int32_t nb_outputs) noexcept {
  if (nb_inputs != kNbInputs || nb_outputs != kNbOutputs || pos < 0 || pos >= kNbInputs + kNbOutputs) return false;
  return in_out[pos].desc.format == nvinfer1::TensorFormat::kLINEAR && type_ok(pos, in_out);
}

size_t DFlashVerifyPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc*, int32_t,
                                            const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept {
  return 0;
}

int32_t DFlashVerifyPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs,
                                          const nvinfer1::PluginTensorDesc*, int32_t nb_outputs) noexcept {
  if (nb_inputs != kNbInputs || nb_outputs != kNbOutputs) return 1;
  const nvinfer1::Dims& logits = in[0].dims;
  const nvinfer1::Dims& drafts = in[1].dims;
  const bool ok = logits.nbDims == 3 && drafts.nbDims == 2 && drafts.d[0] == logits.d[0] &&
                  drafts.d[1] == logits.d[1] - 1 && in[2].dims.d[0] == logits.d[0];
  if (!ok) log_error("DFlashVerify: drafts must be [B, K] for logits [B, K+1, V], start [B]");
  return ok ? 0 : 1;
}

int32_t DFlashVerifyPlugin::enqueue(const nvinfer1::PluginTensorDesc* input_desc,
                                    const nvinfer1::PluginTensorDesc* output_desc, const void* const* inputs,
                                    void* const* outputs, void*, cudaStream_t stream) noexcept {
  const nvinfer1::Dims& dims = input_desc[0].dims;  // [B, K+1, V]
  dfv::VerifyArgs a{};
  a.logits = inputs[0];
  a.logits_dtype = logits_dtype(input_desc[0].type);
  a.batch = static_cast<int32_t>(dims.d[0]);
  a.block_size = static_cast<int32_t>(dims.d[1]);
  a.vocab = static_cast<int32_t>(dims.d[2]);
  a.drafts = dfv::IntIn{inputs[1], id_bytes(input_desc[1].type)};
  a.start = dfv::IntIn{inputs[2], id_bytes(input_desc[2].type)};
  a.temperature = static_cast<const float*>(inputs[3]);
  a.top_k = dfv::IntIn{inputs[4], id_bytes(input_desc[4].type)};
  a.top_p = static_cast<const float*>(inputs[5]);
  a.seed = static_cast<const int64_t*>(inputs[6]);
  a.mask_token_id = mask_token_id_;
  a.tokens = dfv::IntOut{outputs[0], id_bytes(output_desc[0].type)};
  a.accepted = dfv::IntOut{outputs[1], 4};
  a.next_block_ids = dfv::IntOut{outputs[2], id_bytes(output_desc[2].type)};
  if (const char* problem = dfv::describe_args_error(a)) {
    log_error(problem);
    return 1;
  }
  return dfv::launch_verify(a, stream) == cudaSuccess ? 0 : 1;
}

nvinfer1::IPluginV3* DFlashVerifyPlugin::attachToContext(nvinfer1::IPluginResourceContext*) noexcept {
  return clone();  // no per-context resources
}

const nvinfer1::PluginFieldCollection* DFlashVerifyPlugin::getFieldsToSerialize() noexcept {
  fields_[0] = nvinfer1::PluginField("mask_token_id", &mask_token_id_, nvinfer1::PluginFieldType::kINT64, 1);
  field_collection_.nbFields = 1;
  field_collection_.fields = fields_;
  return &field_collection_;
}

DFlashVerifyPluginCreator::DFlashVerifyPluginCreator() {
  fields_[0] = nvinfer1::PluginField("mask_token_id", nullptr, nvinfer1::PluginFieldType::kINT64, 1);
  field_collection_.nbFields = 1;
  field_collection_.fields = fields_;
}

nvinfer1::IPluginV3* DFlashVerifyPluginCreator::createPlugin(const char*, const nvinfer1::PluginFieldCollection* fc,
                                                             nvinfer1::TensorRTPhase) noexcept {
  int64_t mask_token_id = 0;
  if (!read_mask_token_id(fc, mask_token_id)) {
    log_error("DFlashVerify: field mask_token_id must be one int32 or int64");
    return nullptr;
  }
  return new (std::nothrow) DFlashVerifyPlugin(mask_token_id, namespace_);
}

}  // namespace dfv_trt

#if defined(DFV_TRT_STATIC_REGISTRATION)
// Register at load time (dlopen / ctypes.CDLL is enough); needs libnvinfer at link time.
namespace dfv_trt {
REGISTER_TENSORRT_PLUGIN(DFlashVerifyPluginCreator);
}  // namespace dfv_trt
#endif

// Entry points for IPluginRegistry::loadLibrary / trtexec --dynamicPlugins.
extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  dfv_trt::g_logger_finder = finder;
}

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(
    int32_t& nb_creators) {
  static dfv_trt::DFlashVerifyPluginCreator creator;
  static nvinfer1::IPluginCreatorInterface* const creators[] = {&creator};
  nb_creators = 1;
  return creators;
}
