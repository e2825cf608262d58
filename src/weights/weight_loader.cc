// WeightLoader implementation: validation messages name the checkpoint file and tensor.
#include "weights/weight_loader.h"

#include <cstring>
#include <iterator>
#include <string_view>

#include <fmt/ranges.h>

#include "backend/weight_rows.h"
#include "base/log.h"
#include "base/memory_info.h"

namespace dh {
namespace {

// Converts `n` elements of a float tensor to f32.
void ToF32(const Tensor& src, float* dst) {
  const int64_t n = src.numel();
  switch (src.dtype) {
    case DType::kF32: std::memcpy(dst, src.data, n * sizeof(float)); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(src.as<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(src.as<uint16_t>()[i]);
      break;
    default: DH_CHECK(false, "ToF32 of {}", DTypeName(src.dtype));
  }
}

// value[r, c] = fp8[r, c] * scale[r / br, c / bc], from the checkpoint's host bytes (the shared
// row decoder of backend/weight_rows.h reads the scales in their stored dtype).
std::vector<float> DequantizeFp8(const TensorInfo& q, const TensorInfo& scale, int64_t rows,
                                 int64_t cols, int br, int bc) {
  Weight w;
  w.format = WeightFormat::kFp8Block;
  w.data = q.View();
  w.scales = scale.View();
  w.rows = rows;
  w.cols = cols;
  w.block_rows = br;
  w.block_cols = bc;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) DecodeWeightRow(w, r, out.data() + r * cols);
  return out;
}

}  // namespace

Status WeightLoader::CopyToBackend(Tensor* t, const std::string& name) {
  void* dst = converted_.Take(backend_, t->nbytes());
  if (dst == nullptr) {
    return ResourceExhausted("cannot allocate {} bytes for weight '{}'", t->nbytes(), name);
  }
  const void* src = t->data;
  t->data = dst;
  backend_.CopyToDevice(*t, src);
  return Status::Ok();
}

Status WeightLoader::CopyPartsToBackend(Weight& w, const std::string& name) {
  for (Tensor* t : {&w.data, &w.scales, &w.zeros, &w.perm}) {
    if (!t->empty()) DH_RETURN_IF_ERROR(CopyToBackend(t, name));
  }
  return Status::Ok();
}

Status WeightLoader::ReadInFromMapping(Tensor* t, const std::string& name) {
  if (!checkpoint_.mapped_to_fit() || left_mapped_ || t->empty()) return Status::Ok();
  const uint64_t bytes = t->nbytes();
  const MemoryInfo mem = ReadMemoryInfo();
  const uint64_t headroom = std::min<uint64_t>(kReadInHeadroomBytes, mem.available / 4);
  if (mem.available != 0 && mem.available - headroom < bytes) {  // headroom <= available
    left_mapped_ = true;
    DH_LOG(Warning, "{}: '{}' and the tensors after it that are used as stored stay in the "
           "mapped files: {} left ({}) would not leave {} free after a {} copy",
           checkpoint_.dir(), name, FormatBytes(mem.available), mem.source,
           FormatBytes(headroom), FormatBytes(bytes));
    return Status::Ok();
  }
  return CopyToBackend(t, name);
}

WeightLoader::WeightLoader(const Checkpoint& checkpoint, const ModelConfig& config,
                           Backend& backend, const LoadOptions& options)
    : checkpoint_(checkpoint), config_(config), backend_(backend), options_(options) {
  if (options.show_progress) {
    progress_ = std::make_unique<ProgressBar>("loading", checkpoint.total_bytes());
  }
}

Result<Weight> WeightLoader::UploadQuantized(std::span<const float> values, int64_t rows,
                                             int64_t cols, const std::string& name,
                                             const QuantSpec& spec) {
  DH_ASSIGN_OR_RETURN(QuantizedMatrix q, QuantizeMatrix(values, rows, cols, spec, name));
  Weight w = q.View();
  DH_RETURN_IF_ERROR(CopyPartsToBackend(w, name));
  loaded_as_[name] = {std::string(WeightFormatName(w.format)), w.nbytes()};
  return PrepareNamed(name, w);
}

Result<const TensorInfo*> WeightLoader::Find(const std::string& name) {
  const TensorInfo* t = checkpoint_.Find(name);
  if (t == nullptr) {
    return NotFound("{}: missing tensor '{}' required by {}", checkpoint_.dir(), name,
                    config_.architecture);
  }
  if (used_.insert(name).second && progress_) progress_->Update(loaded_bytes_ += t->nbytes);
  return t;
}

Result<Tensor> WeightLoader::Upload(const Tensor& host, DType dtype) {
  // Converts a host f32/f16/bf16 tensor to `dtype` in backend memory.
  const int64_t n = host.numel();
  std::vector<float> f32(n);
  ToF32(host, f32.data());
  Tensor out = host;
  out.dtype = dtype;
  out.SetContiguousStrides();
  void* dst = converted_.Take(backend_, out.nbytes());
  if (dst == nullptr) return ResourceExhausted("cannot allocate {} bytes for a weight", out.nbytes());
  std::vector<uint8_t> staged(out.nbytes());
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: reinterpret_cast<float*>(staged.data())[i] = f32[i]; break;
      case DType::kBF16: reinterpret_cast<uint16_t*>(staged.data())[i] = F32ToBF16(f32[i]); break;
      case DType::kF16: reinterpret_cast<uint16_t*>(staged.data())[i] = F32ToF16(f32[i]); break;
      default: DH_CHECK(false);
    }
  }
  out.data = dst;
  backend_.CopyToDevice(out, staged.data());
  return out;
}

Result<Weight> WeightLoader::Matrix(const std::string& name, int64_t rows, int64_t cols) {
  if (const std::string base = PackedInt4Base(name); !base.empty()) {
    return LoadPackedInt4(base, rows, cols);  // AWQ / GPTQ: weight_loader_packed.cc
  }
  DH_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  if (!t->HasShape({rows, cols})) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} for this config", t->file,
                           name, t->ShapeString(), FormatShape({rows, cols}));
  }
  num_parameters_ += rows * cols;
  Weight w;
  w.rows = rows;
  w.cols = cols;
  // The policy's format: quantized, dense `requested`, or (neither) as stored.
  const PrecisionFormat target = plan().policy.FormatFor(name);
  const bool quantize = target.kind == PrecisionFormat::Kind::kQuant;
  const std::optional<DType> requested = target.kind == PrecisionFormat::Kind::kDense
                                             ? std::optional<DType>(target.dtype)
                                         : quantize ? std::nullopt
                                                    : plan().dtype;
  if (t->dtype == DType::kF8E4M3) {
    const auto& q = config_.quantization;
    const int br = q.block_rows > 0 ? q.block_rows : 128;
    const int bc = q.block_cols > 0 ? q.block_cols : 128;
    DH_ASSIGN_OR_RETURN(const TensorInfo* s, FindFp8Scale(name, rows, cols));
    const std::string& scale_name = s->name;
    w.format = WeightFormat::kFp8Block;
    w.block_rows = br;
    w.block_cols = bc;
    w.data = t->View();
    if (s->dtype == DType::kF32) {
      w.scales = s->View();
    } else {
      DH_ASSIGN_OR_RETURN(w.scales, Upload(s->View(), DType::kF32));
    }
    // An fp8 target keeps the checkpoint's own FP8 blocks.
    const bool keep = quantize && target.quant.format == WeightFormat::kFp8Block;
    if (!keep && (requested || quantize)) {
      // --dtype / the policy ask for another format: dequantize once at load.
      std::vector<float> dense = DequantizeFp8(*t, *s, rows, cols, br, bc);
      loaded_as_[scale_name] = {"", 0};
      if (quantize) return UploadQuantized(dense, rows, cols, name, target.quant);
      Tensor host(dense.data(), DType::kF32, {rows, cols});
      DH_ASSIGN_OR_RETURN(Tensor converted, Upload(host, *requested));
      w = Weight::Dense(converted);
      loaded_as_[name] = {std::string(DTypeName(*requested)), w.nbytes()};
    } else {
      DH_RETURN_IF_ERROR(ReadInFromMapping(&w.data, name));
      if (s->dtype == DType::kF32) DH_RETURN_IF_ERROR(ReadInFromMapping(&w.scales, scale_name));
    }
    return PrepareNamed(name, w);
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected F32, BF16, F16 or F8_E4M3",
                           t->file, name, SafetensorsDTypeName(t->dtype));
  }
  Tensor data = t->View();
  if (quantize) {
    // One f32 staging buffer for all tensors: a fresh vector per tensor spent most of a
    // quantized load zeroing and faulting in new pages.
    const size_t n = static_cast<size_t>(rows * cols);
    if (quant_staging_.size() < n) quant_staging_.resize(n);
    ToF32(data, quant_staging_.data());
    return UploadQuantized(std::span<const float>(quant_staging_.data(), n), rows, cols, name,
                           target.quant);
  }
  if (requested && *requested != data.dtype) {
    DH_ASSIGN_OR_RETURN(data, Upload(data, *requested));
    loaded_as_[name] = {std::string(DTypeName(*requested)), data.nbytes()};
  } else {
    DH_RETURN_IF_ERROR(ReadInFromMapping(&data, name));
  }
  w = Weight::Dense(data);
  return PrepareNamed(name, w);
}

Result<const TensorInfo*> WeightLoader::FindFp8Scale(const std::string& name, int64_t rows,
                                                      int64_t cols) {
  const std::string scale_name =
      name.substr(0, name.size() - std::string(".weight").size()) + ".weight_scale_inv";
  const auto& q = config_.quantization;
  const int br = q.block_rows > 0 ? q.block_rows : 128;
  const int bc = q.block_cols > 0 ? q.block_cols : 128;
  DH_ASSIGN_OR_RETURN(const TensorInfo* s, Find(scale_name));
  const int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
  if (!s->HasShape({srows, scols})) {
    return InvalidArgument("{}: scale tensor '{}' has shape {}, expected {} ({}x{} blocks of {})",
                           s->file, scale_name, s->ShapeString(), FormatShape({srows, scols}), br,
                           bc, FormatShape({rows, cols}));
  }
  if (s->dtype != DType::kF32 && s->dtype != DType::kBF16 && s->dtype != DType::kF16) {
    return InvalidArgument("{}: scale tensor '{}' has dtype {}, expected F32/BF16", s->file,
                           scale_name, SafetensorsDTypeName(s->dtype));
  }
  return s;
}

Result<std::vector<float>> WeightLoader::HostMatrixF32(const std::string& name, int64_t rows,
                                                       int64_t cols, DType* stored_dtype) {
  if (const std::string base = PackedInt4Base(name); !base.empty()) {
    return HostPackedInt4F32(base, rows, cols, stored_dtype);
  }
  const TensorInfo* t = checkpoint_.Find(name);
  if (t == nullptr) return NotFound("{}: missing tensor '{}'", checkpoint_.dir(), name);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  if (t->dtype == DType::kF8E4M3) {
    // Matrix(name) has validated the tensor and its scales (see the header's precondition).
    const auto& q = config_.quantization;
    const TensorInfo* scale = checkpoint_.Find(name.substr(0, name.size() - 7) + ".weight_scale_inv");
    if (!used_.count(name) || scale == nullptr) {
      return Internal("HostMatrixF32('{}') before Matrix() validated it", name);
    }
    out = DequantizeFp8(*t, *scale, rows, cols, q.block_rows > 0 ? q.block_rows : 128,
                        q.block_cols > 0 ? q.block_cols : 128);
    *stored_dtype = PolicyDenseDType(name, DType::kBF16);
    return out;
  }
  if (!t->HasShape({rows, cols})) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} for this config", t->file,
                           name, t->ShapeString(), FormatShape({rows, cols}));
  }
  if (!IsFloat(t->dtype) || DTypeSize(t->dtype) > 4 || DTypeSize(t->dtype) < 2) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", t->file,
                           name, SafetensorsDTypeName(t->dtype));
  }
  ToF32(t->View(), out.data());
  *stored_dtype = PolicyDenseDType(name, plan().dtype.value_or(t->dtype));
  return out;
}

DType WeightLoader::PolicyDenseDType(const std::string& name, DType fallback) const {
  const PrecisionFormat f = plan().policy.FormatFor(name);
  if (f.kind == PrecisionFormat::Kind::kDense) return f.dtype;
  return f.kind == PrecisionFormat::Kind::kQuant ? DType::kBF16 : fallback;
}

bool WeightLoader::IsRowReadTable(std::string_view name) {
  constexpr std::string_view kTable = "embed_tokens.weight";
  return name.size() >= kTable.size() &&
         name.compare(name.size() - kTable.size(), kTable.size(), kTable) == 0;
}

Result<Weight> WeightLoader::PrepareNamed(const std::string& name, Weight w) {
  w.read_by_rows = keep_rows_ || IsRowReadTable(name);
  return backend_.PrepareWeight(w);
}

Result<Weight> WeightLoader::MatrixFromHost(std::span<const float> values, int64_t rows,
                                            int64_t cols, DType dtype) {
  Tensor host(const_cast<float*>(values.data()), DType::kF32, {rows, cols});
  DH_ASSIGN_OR_RETURN(Tensor t, Upload(host, dtype));
  return backend_.PrepareWeight(Weight::Dense(t));
}

Result<Weight> WeightLoader::QuantizedFromHost(std::span<const float> values, int64_t rows,
                                               int64_t cols, const std::string& name) {
  const PrecisionFormat target = plan().policy.FormatFor(name);
  if (target.kind != PrecisionFormat::Kind::kQuant) {
    return Internal("weight '{}': the policy gives it no quantized format", name);
  }
  if (values.size() != static_cast<size_t>(rows * cols)) {
    return Internal("weight '{}': {} values for [{}, {}]", name, values.size(), rows, cols);
  }
  return UploadQuantized(values, rows, cols, name, target.quant);
}

Result<std::vector<Weight>> WeightLoader::DerivedMatrices(
    const std::string& name, std::span<const std::array<int64_t, 2>> shapes,
    const std::function<Result<std::vector<Weight>>()>& compute) {
  DH_ASSIGN_OR_RETURN(std::vector<Weight> out, compute());
  if (out.size() != shapes.size()) {
    return Internal("derived weights '{}': {} computed, {} expected", name, out.size(),
                    shapes.size());
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].rows != shapes[i][0] || out[i].cols != shapes[i][1]) {
      return Internal("derived weight '{}#{}' is [{}, {}], expected [{}, {}]", name, i,
                      out[i].rows, out[i].cols, shapes[i][0], shapes[i][1]);
    }
  }
  return out;
}

Result<Weight> WeightLoader::MatrixPart(const std::string& name, int64_t rows, int64_t cols,
                                        const MatrixSlice& slice) {
  if (slice.whole()) return Matrix(name, rows, cols);
  const bool by_rows = slice.axis == MatrixSlice::Axis::kRows;
  const int64_t extent = by_rows ? rows : cols;
  if (slice.begin < 0 || slice.count <= 0 || slice.begin + slice.count > extent) {
    return Internal("tensor '{}': slice [{}, {}) outside its {} {}", name, slice.begin,
                    slice.begin + slice.count, extent, by_rows ? "rows" : "columns");
  }
  if (!PackedInt4Base(name).empty()) {
    return Unsupported("tensor '{}': AWQ/GPTQ int4 weights cannot be split over tensor-parallel "
                       "ranks; use --tp-size 1", name);
  }
  DH_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  if (!t->HasShape({rows, cols})) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} for this config", t->file,
                           name, t->ShapeString(), FormatShape({rows, cols}));
  }
  num_parameters_ += rows * cols;
  const int64_t part_rows = by_rows ? slice.count : rows;
  const int64_t part_cols = by_rows ? cols : slice.count;
  const int64_t row0 = by_rows ? slice.begin : 0, col0 = by_rows ? 0 : slice.begin;
  // The slice on the host in a float dtype: as stored, or f32 from dequantized FP8 blocks.
  DType host_dtype = t->dtype, dense_dtype = t->dtype;
  const uint8_t* src = t->data;
  std::vector<float> dequantized;
  if (t->dtype == DType::kF8E4M3) {
    DH_ASSIGN_OR_RETURN(const TensorInfo* s, FindFp8Scale(name, rows, cols));
    const auto& q = config_.quantization;
    dequantized = DequantizeFp8(*t, *s, rows, cols, q.block_rows > 0 ? q.block_rows : 128,
                                q.block_cols > 0 ? q.block_cols : 128);
    loaded_as_[s->name] = {"", 0};
    src = reinterpret_cast<const uint8_t*>(dequantized.data());
    host_dtype = DType::kF32;
    dense_dtype = PolicyDenseDType(name, DType::kBF16);
  } else if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected F32, BF16, F16 or F8_E4M3",
                           t->file, name, SafetensorsDTypeName(t->dtype));
  }
  const size_t elem = DTypeSize(host_dtype);
  std::vector<uint8_t> part(static_cast<size_t>(part_rows * part_cols) * elem);
  for (int64_t r = 0; r < part_rows; ++r) {
    std::memcpy(part.data() + r * part_cols * elem, src + ((row0 + r) * cols + col0) * elem,
                part_cols * elem);
  }
  Tensor host(part.data(), host_dtype, {part_rows, part_cols});
  const PrecisionFormat target = plan().policy.FormatFor(name);
  if (target.kind == PrecisionFormat::Kind::kQuant) {
    std::vector<float> f32(static_cast<size_t>(part_rows * part_cols));
    ToF32(host, f32.data());
    return UploadQuantized(f32, part_rows, part_cols, name, target.quant);
  }
  const DType dtype = target.kind == PrecisionFormat::Kind::kDense ? target.dtype
                                                                   : plan().dtype.value_or(dense_dtype);
  DH_ASSIGN_OR_RETURN(Tensor data, Upload(host, dtype));
  loaded_as_[name] = {std::string(DTypeName(dtype)), data.nbytes()};
  Weight out = Weight::Dense(data);
  // One process keeps an FP8 weight as FP8 unless a dtype is asked for; its dense slice stands in
  // for it with x exact, so the slice adds one rounding to the exact product (weight * scale to
  // bf16), as one process adds one (x * scale to bf16 where DH_BF16_DOT rounds x,
  // backend/cpu/gemm_bf16.h).
  out.exact_x = t->dtype == DType::kF8E4M3 && target.kind != PrecisionFormat::Kind::kDense &&
                !plan().dtype.has_value();
  return PrepareNamed(name, out);
}

Result<Tensor> WeightLoader::VectorPart(const std::string& name, int64_t n, int64_t begin,
                                        int64_t count) {
  if (begin == 0 && count == n) return Vector(name, n);
  DH_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  if (!t->HasShape({n})) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} for this config", t->file,
                           name, t->ShapeString(), FormatShape({n}));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", t->file,
                           name, SafetensorsDTypeName(t->dtype));
  }
  if (begin < 0 || count <= 0 || begin + count > n) {
    return Internal("tensor '{}': slice [{}, {}) outside its {} elements", name, begin,
                    begin + count, n);
  }
  num_parameters_ += n;
  const Tensor part(const_cast<uint8_t*>(t->data) + begin * DTypeSize(t->dtype), t->dtype,
                    {count});
  DH_ASSIGN_OR_RETURN(Tensor out, Upload(part, DType::kF32));
  // Counted like Vector's: the stored dtype's bytes, of the slice only.
  loaded_as_[name] = {std::string(DTypeName(t->dtype)), part.nbytes()};
  return out;
}

Result<Tensor> WeightLoader::Vector(const std::string& name, int64_t n) {
  DH_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  if (!t->HasShape({n})) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} for this config", t->file,
                           name, t->ShapeString(), FormatShape({n}));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", t->file,
                           name, SafetensorsDTypeName(t->dtype));
  }
  num_parameters_ += n;
  return Upload(t->View(), DType::kF32);
}

Result<Tensor> WeightLoader::OptionalVector(const std::string& name, int64_t n) {
  if (!Has(name)) return Tensor();
  return Vector(name, n);
}

Status WeightLoader::Finish(ModelInfo* info) {
  if (progress_) progress_->Finish();
  info->num_parameters = num_parameters_;
  info->num_tensors = static_cast<int64_t>(checkpoint_.tensors().size());
  info->weight_bytes = 0;
  std::vector<std::string> unused;
  int64_t num_unused = 0;
  for (const TensorInfo* t : checkpoint_.tensors()) {
    bool skipped = false;
    for (const auto& p : skipped_prefixes_) skipped = skipped || t->name.rfind(p, 0) == 0;
    if (skipped) {
      ++info->skipped_tensors;
      continue;
    }
    // The greatest prefix not above the name is the only one that can start it (prefix-free).
    if (auto it = other_rank_prefixes_.upper_bound(t->name); it != other_rank_prefixes_.begin() &&
                                                             t->name.rfind(*std::prev(it), 0) == 0) {
      continue;
    }
    if (!used_.count(t->name)) {
      if (unused.size() < 3) unused.push_back(t->name);
      ++num_unused;
      continue;
    }
    if (auto p = prequantized_bytes_.find(t->name); p != prequantized_bytes_.end()) {
      // AWQ / GPTQ tensors: the converted int4 weight's bytes, under "int4".
      info->bytes_by_dtype[std::string(WeightFormatName(WeightFormat::kInt4))] +=
          static_cast<int64_t>(p->second);
      info->weight_bytes += p->second;
      continue;
    }
    if (auto q = loaded_as_.find(t->name); q != loaded_as_.end()) {
      // Quantized or converted at load: count the bytes the kernels read, under their format.
      if (q->second.first.empty()) continue;
      info->bytes_by_dtype[q->second.first] += static_cast<int64_t>(q->second.second);
      info->weight_bytes += q->second.second;
      continue;
    }
    info->bytes_by_dtype[std::string(DTypeName(t->dtype))] += static_cast<int64_t>(t->nbytes);
    info->weight_bytes += t->nbytes;
  }
  // Weights made at load under names the checkpoint lacks (QuantizedFromHost).
  for (const auto& [name, as] : loaded_as_) {
    if (as.first.empty() || checkpoint_.Find(name) != nullptr) continue;
    info->bytes_by_dtype[as.first] += static_cast<int64_t>(as.second);
    info->weight_bytes += as.second;
  }
  if (num_unused > 0) {
    DH_LOG(Warning, "{}: {} checkpoint tensors are not used by {} (e.g. {})", checkpoint_.dir(),
           num_unused, config_.architecture, fmt::join(unused, ", "));
  }
  if (info->skipped_tensors > 0) {
    DH_LOG(Info, "{}: skipped {} tensors of multi-token-prediction layers", checkpoint_.dir(),
           info->skipped_tensors);
  }
  return Status::Ok();
}

}  // namespace dh
