// WeightLoader: finds checkpoint tensors by their Hugging Face names, validates dtype and shape
// against what the architecture expects, converts dtype when asked (--dtype), handles the FP8
// block-scale format, hands each weight to the backend, and records what was used so unused or
// skipped tensors can be reported.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/buffer_chunks.h"
#include "base/progress.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "weights/load_options.h"
#include "weights/precision_policy.h"
#include "weights/quantize.h"
#include "weights/weight_plan.h"

namespace dh {

// The part of a checkpoint matrix [rows, cols] one tensor-parallel rank loads: rows or columns
// [begin, begin + count), or the whole matrix (kWhole).
struct MatrixSlice {
  enum class Axis : uint8_t { kWhole, kRows, kCols };
  Axis axis = Axis::kWhole;
  int64_t begin = 0, count = 0;

  static MatrixSlice Rows(int64_t begin, int64_t count) { return {Axis::kRows, begin, count}; }
  static MatrixSlice Cols(int64_t begin, int64_t count) { return {Axis::kCols, begin, count}; }
  bool whole() const { return axis == Axis::kWhole; }
};

// ReadInFromMapping's headroom: the memory a copy out of the mapped checkpoint leaves free for
// the weights still to convert, the KV cache and the activations.
inline constexpr uint64_t kReadInHeadroomBytes = uint64_t{4} << 30;

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& checkpoint, const ModelConfig& config, Backend& backend,
               const LoadOptions& options);
  // Virtual so the compile cache (weights/compile_cache_writer.cc, compile_cache_reader.cc) can
  // record or serve what it produces.
  virtual ~WeightLoader() = default;

  // A matrix [rows, cols] named `name` (".weight" is not appended). FP8 tensors take their
  // `<name minus .weight>.weight_scale_inv` block scales. Dense weights may be f32/f16/bf16.
  virtual Result<Weight> Matrix(const std::string& name, int64_t rows, int64_t cols);
  // Part of matrix `name` (stored as [rows, cols]): a copy of the slice in backend memory, in the
  // format Matrix would give (FP8 blocks are dequantized to the policy's dense dtype, bf16 by
  // default). A whole slice is Matrix(name, rows, cols).
  Result<Weight> MatrixPart(const std::string& name, int64_t rows, int64_t cols,
                            const MatrixSlice& slice);
  // Elements [begin, begin + count) of vector `name` [n], as f32 (a split bias).
  Result<Tensor> VectorPart(const std::string& name, int64_t n, int64_t begin, int64_t count);
  // A vector [n] (norm weight, bias, router bias) as f32 on the backend.
  virtual Result<Tensor> Vector(const std::string& name, int64_t n);
  // Like Vector, but an absent tensor gives an empty Tensor.
  Result<Tensor> OptionalVector(const std::string& name, int64_t n);
  // The dequantized f32 values of matrix `name` on the host (for weights the architecture
  // rearranges at load, e.g. MLA's absorbed kv_b_proj), and the dtype it is stored in (bf16 for
  // FP8 checkpoints, so rearranged copies stay compact). For FP8 tensors, call Matrix(name)
  // first: it validates the tensor and its scales.
  Result<std::vector<float>> HostMatrixF32(const std::string& name, int64_t rows, int64_t cols,
                                           DType* stored_dtype);
  // A dense weight [rows, cols] from host f32 values, stored as `dtype` on the backend.
  Result<Weight> MatrixFromHost(std::span<const float> values, int64_t rows, int64_t cols,
                                DType dtype);
  // A weight [rows, cols] from host f32 values in the quantized format the policy gives `name`
  // (a name the checkpoint need not have: a tied table's quantized lm_head copy); its bytes count
  // in Finish's totals, its parameters are its source's. Internal error when the policy does not
  // quantize `name`.
  Result<Weight> QuantizedFromHost(std::span<const float> values, int64_t rows, int64_t cols,
                                   const std::string& name);
  // Weights derived from checkpoint tensors at load (MLA's absorbed kv_b copies): `compute`
  // builds them (with HostMatrixF32 + MatrixFromHost); result i must be [shapes[i][0],
  // shapes[i][1]]. A compile cache stores them under `name` and serves them without `compute`.
  virtual Result<std::vector<Weight>> DerivedMatrices(
      const std::string& name, std::span<const std::array<int64_t, 2>> shapes,
      const std::function<Result<std::vector<Weight>>()>& compute);
  virtual bool Has(const std::string& name) const { return checkpoint_.Find(name) != nullptr; }

  // Tensors whose name starts with `prefix` are accepted as present but unused (e.g. MTP layers).
  void Skip(const std::string& prefix) { skipped_prefixes_.push_back(prefix); }
  // Tensors whose name starts with `prefix` belong to another tensor-parallel rank (routed
  // experts under expert parallelism): accepted as present, not loaded, not counted. No such
  // prefix may be a prefix of another (each ends with ".").
  void SkipOtherRank(const std::string& prefix) { other_rank_prefixes_.insert(prefix); }
  // Fills info with counts and lists; error if a checkpoint tensor was neither used nor skipped.
  virtual Status Finish(ModelInfo* info);

  // Hands over the buffers of converted weights; the model must keep them alive.
  std::shared_ptr<void> TakeOwnedBuffers() {
    return std::make_shared<std::vector<std::unique_ptr<Buffer>>>(converted_.Release());
  }
  // Everything the weights handed out point into (owned buffers; a compile cache's file image),
  // for the model to keep alive. The checkpoint itself is the caller's.
  virtual std::vector<std::shared_ptr<void>> TakeResources() { return {TakeOwnedBuffers()}; }
  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  // backend().PrepareWeight(w) for weight `name`, marked read_by_rows when it is an embedding
  // table (a backend then keeps its row layout: the lookups read it) or keep_rows_ is set.
  Result<Weight> PrepareNamed(const std::string& name, Weight w);
  // Whether weight `name` is a table also read a row at a time (an embedding).
  static bool IsRowReadTable(std::string_view name);
  // Every weight is read by rows after it is prepared (a compile cache writer records them).
  bool keep_rows_ = false;
  const LoadOptions& options() const { return options_; }
  const WeightPlan& plan() const { return options_.plan; }
  // True when `name` starts with a prefix given to Skip.
  bool IsSkipped(const std::string& name) const {
    for (const auto& p : skipped_prefixes_)
      if (name.rfind(p, 0) == 0) return true;
    return false;
  }

 private:
  Result<const TensorInfo*> Find(const std::string& name);
  // The validated block-scale tensor of FP8 matrix `name` [rows, cols].
  Result<const TensorInfo*> FindFp8Scale(const std::string& name, int64_t rows, int64_t cols);
  Result<Tensor> Upload(const Tensor& host, DType dtype);
  // Copies host tensor `t` to backend memory from converted_ and points `t` at it; `name` is for
  // the error message.
  Status CopyToBackend(Tensor* t, const std::string& name);
  // CopyToBackend for each host part of `w` (data, scales, zeros, perm).
  Status CopyPartsToBackend(Weight& w, const std::string& name);
  // A tensor `t` used as stored, still in the checkpoint's files: when they are mapped only
  // because they exceed the memory left (Checkpoint::mapped_to_fit), copied into backend memory
  // from converted_ and `t` pointed at the copy, as long as that leaves kReadInHeadroomBytes (or
  // a quarter of the memory left, if less) free; otherwise it stays in the mapping, and so do
  // the tensors after it (one warning names the first). In the mapping, the pages of a tensor
  // read a few rows at a time (the embedding table: one row per token) go cold, the kernel drops
  // them as the converted weights fill memory, and each lookup then waits for the disk:
  // DeepSeek-V2-Lite (29.3 GiB bf16) quantized at load on a 24 GiB machine spent 3.4 ms per
  // decode step, 6.7 % of it, in the embedding.
  Status ReadInFromMapping(Tensor* t, const std::string& name);
  // The dense dtype for copies the architecture derives from matrix `name` (HostMatrixF32): the
  // policy's dense format, bf16 when the policy quantizes it, else `fallback`.
  DType PolicyDenseDType(const std::string& name, DType fallback) const;
  // Quantizes host f32 values [rows, cols] per `spec` (from the precision policy) into backend
  // memory.
  Result<Weight> UploadQuantized(std::span<const float> values, int64_t rows, int64_t cols,
                                 const std::string& name, const QuantSpec& spec);

  // AWQ / GPTQ int4 projections stored as <base>.qweight, .qzeros, .scales (, .g_idx) instead of
  // <base>.weight (weights/packed_int4.h; defined in weight_loader_packed.cc). PackedInt4Base is
  // <base> when `name` is "<base>.weight" and the checkpoint has <base>.qweight, else "".
  std::string PackedInt4Base(const std::string& name) const;
  Result<Weight> LoadPackedInt4(const std::string& base, int64_t rows, int64_t cols);
  Result<std::vector<float>> HostPackedInt4F32(const std::string& base, int64_t rows,
                                               int64_t cols, DType* stored_dtype);
  // Packed int4 tensors: name -> bytes as loaded (qweight: the converted weight; its companions
  // 0), counted under "int4" by Finish.
  std::map<std::string, uint64_t> prequantized_bytes_;
  // f32 copy of the tensor being quantized, reused (grown, never shrunk) across tensors.
  std::vector<float> quant_staging_;
  bool logged_prequantized_ = false;
  bool left_mapped_ = false;  // ReadInFromMapping found memory short: it copies no more

  const Checkpoint& checkpoint_;
  const ModelConfig& config_;
  Backend& backend_;
  LoadOptions options_;
  std::set<std::string> used_;
  std::vector<std::string> skipped_prefixes_;
  std::set<std::string> other_rank_prefixes_;  // thousands under expert parallelism
  // Backend memory of the weights converted at load (quantized, dtype-converted, AWQ/GPTQ
  // repacked), shared buffers so that on the CPU small ones lie in 2 MiB pages; each starts on
  // 256 bytes (a cache line on the CPU, CUDA's allocation granule).
  BufferChunks converted_{256};
  int64_t num_parameters_ = 0;
  std::unique_ptr<ProgressBar> progress_;
  uint64_t loaded_bytes_ = 0;
  // Tensors not loaded as stored (quantized or converted): name -> (format name, bytes as loaded:
  // data + scales + mins), for Finish's counts. An empty format name: not counted (the scales of
  // a dequantized FP8 tensor).
  std::map<std::string, std::pair<std::string, uint64_t>> loaded_as_;
};

}  // namespace dh
