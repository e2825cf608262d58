// ShapeCheckLoader: a WeightLoader that validates against the checkpoint's headers and records,
// instead of loading (see verify_tensors.h).
#include "tools/verify_tensors.h"

#include <set>
#include <string>

#include "model/model.h"
#include "weights/weight_loader.h"
#include "weights/weight_plan.h"

namespace dh {
namespace {

std::string Dims(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool IsDenseFloat(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// A weight of the right shape that points at nothing: the model is only constructed, never run.
Weight Placeholder(int64_t rows, int64_t cols) {
  Weight w;
  w.data = Tensor::FromDims(nullptr, DType::kF32, std::vector<int64_t>{rows, cols});
  w.rows = rows;
  w.cols = cols;
  return w;
}

class ShapeCheckLoader : public WeightLoader {
 public:
  ShapeCheckLoader(const Checkpoint& c, const ModelConfig& config, Backend& backend,
                   const LoadOptions& options)
      : WeightLoader(c, config, backend, options), ckpt_(c) {}

  std::vector<VerifyProblem> problems;
  std::set<std::string> used;

  Result<Weight> Matrix(const std::string& name, int64_t rows, int64_t cols) override {
    const std::string base = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                                 ? name.substr(0, name.size() - 7)
                                 : name;
    if (name != base && ckpt_.Find(base + ".qweight") != nullptr) return Packed(base, rows, cols);
    const TensorInfo* t = Lookup(name, {rows, cols});
    if (t == nullptr) return Placeholder(rows, cols);
    if (t->dtype == DType::kF8E4M3) {
      const std::string scales = base + ".weight_scale_inv";
      if (ckpt_.Find(scales) == nullptr) {
        Problem(name, "FP8 weight without its block scales '" + scales + "'");
      } else {
        used.insert(scales);  // the grid itself is the fp8-scales check's
      }
    } else if (!IsDenseFloat(t->dtype)) {
      Problem(name, std::string("dtype ") + std::string(DTypeName(t->dtype)) +
                        ": expected F32, BF16, F16 or F8_E4M3 for a matrix");
    }
    return Placeholder(rows, cols);
  }

  Result<Tensor> Vector(const std::string& name, int64_t n) override {
    const TensorInfo* t = Lookup(name, {n});
    if (t != nullptr && !IsDenseFloat(t->dtype))
      Problem(name, std::string("dtype ") + std::string(DTypeName(t->dtype)) +
                        ": expected F32, BF16 or F16 for a vector");
    return Tensor::FromDims(nullptr, DType::kF32, std::vector<int64_t>{n});
  }

  Result<std::vector<Weight>> DerivedMatrices(
      const std::string&, std::span<const std::array<int64_t, 2>> shapes,
      const std::function<Result<std::vector<Weight>>()>&) override {
    std::vector<Weight> out;
    for (const auto& s : shapes) out.push_back(Placeholder(s[0], s[1]));
    return out;
  }

  Status Finish(ModelInfo*) override {
    for (const TensorInfo* t : ckpt_.tensors()) {
      if (used.count(t->name) || IsSkipped(t->name)) continue;
      Problem(t->name, Dims(t->shape) + " " + std::string(DTypeName(t->dtype)) + " in " +
                           t->file + ": not used by " + config().architecture +
                           " with this config.json (unexpected tensor)");
    }
    return Status::Ok();
  }

 private:
  void Problem(const std::string& where, std::string msg) {
    problems.push_back({"tensors", where, std::move(msg)});
  }

  // The tensor when present with this shape (recorded as used either way); else a problem.
  const TensorInfo* Lookup(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = ckpt_.Find(name);
    if (t == nullptr) {
      Problem(name, "missing: expected " + Dims(shape) + " for this config.json");
      return nullptr;
    }
    used.insert(name);
    if (t->shape != shape) {
      Problem(name, "shape " + Dims(t->shape) + " in " + t->file + ", expected " + Dims(shape) +
                        " for this config.json");
      return nullptr;
    }
    return t;
  }

  // AWQ / GPTQ: <base>.qweight, .qzeros, .scales (, .g_idx). Their mutual consistency is the
  // packing check's; here the outer shape: scales [groups, rows], and cols inputs (AWQ qweight
  // [cols, rows/8], GPTQ [cols/8, rows]).
  Result<Weight> Packed(const std::string& base, int64_t rows, int64_t cols) {
    const TensorInfo* q = ckpt_.Find(base + ".qweight");
    used.insert(base + ".qweight");
    for (const char* part : {".qzeros", ".scales", ".g_idx"})
      if (ckpt_.Find(base + part) != nullptr) used.insert(base + part);
    const TensorInfo* s = ckpt_.Find(base + ".scales");
    if (s == nullptr || s->shape.size() != 2 || q->shape.size() != 2) return Placeholder(rows, cols);
    const bool awq = config().quantization.method == "awq";
    const int64_t in = awq ? q->shape[0] : q->shape[0] * 8;
    if (s->shape[1] != rows || in != cols) {
      Problem(base + ".qweight", "packs " + std::to_string(s->shape[1]) + " outputs x " +
                                     std::to_string(in) + " inputs, expected " + Dims({rows, cols}) +
                                     " for this config.json");
    }
    return Placeholder(rows, cols);
  }

  const Checkpoint& ckpt_;
};

}  // namespace

std::vector<VerifyProblem> CheckExpectedTensors(const Checkpoint& checkpoint,
                                                const ModelConfig& config, Backend& backend) {
  auto factory = FindArchitecture(config.architecture);
  if (!factory.ok()) return {{"tensors", "config.json", factory.status().message()}};
  LoadOptions options;  // the default plan: tensors as stored
  // A multi-token-prediction layer the checkpoint carries (docs/mtp.md) is checked like the main
  // layers: loaded with its shapes, not skipped. Releases that dropped it (config still says
  // num_nextn_predict_layers > 0, no tensors under that layer) are not flagged: the engine skips it.
  if (config.num_nextn_predict_layers > 0) {
    const std::string mtp_prefix =
        "model.layers." + std::to_string(config.num_hidden_layers) + ".";
    for (const TensorInfo* t : checkpoint.tensors()) {
      if (t->name.compare(0, mtp_prefix.size(), mtp_prefix) == 0) {
        options.load_mtp = true;
        break;
      }
    }
  }
  ShapeCheckLoader loader(checkpoint, config, backend, options);
  auto model = (*factory)(config, loader, backend);
  std::vector<VerifyProblem> problems = std::move(loader.problems);
  // The factory's own errors (a config it rejects) come after what the loader collected.
  if (!model.ok()) problems.push_back({"tensors", "config.json", model.status().message()});
  return problems;
}

}  // namespace dh
