// Per-layer precision policy (--policy): which format each weight matrix takes at load, chosen by
// the matrix's class (derived from its Hugging Face name) and, optionally, its layer. Model code
// never sees the policy: WeightLoader::Matrix asks FormatFor(name) and hands back a Weight in
// that format. Grammar and the dynamic rule: docs/quantization.md.
//
//   static:FMT               every projection (attn, mla, mlp, experts, shared, lm_head) as FMT;
//                            embeddings and the MoE router stay as stored
//   dynamic                  the built-in mixed rule (DynamicPolicyText())
//   custom:KEY=FMT,...       KEY is a class, `default` (every projection class not named) or
//                            `layers.A-B[.CLASS]` (in-layer projections of layers A..B); classes
//                            not named stay as stored. `attn` also sets `mla` unless it is named.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"
#include "weights/quantize.h"

namespace dh {

// What a weight matrix is, by its name (ClassifyWeight).
enum class WeightClass : uint8_t {
  kEmbed,    // model.embed_tokens.weight
  kAttn,     // self_attn.{q,k,v,o}_proj (GQA/MHA, and MLA's q_proj without q_lora and o_proj)
  kMla,      // MLA's low-rank projections: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj
  kMlp,      // dense FFN: mlp.{gate,up,down}_proj
  kExperts,  // routed experts: mlp.experts.E.*
  kShared,   // shared experts: mlp.shared_experts.*
  kGate,     // MoE router: mlp.gate.weight
  kLmHead,   // lm_head.weight
  kOther,    // any other matrix: follows `default`
};
inline constexpr int kNumWeightClasses = 9;

std::string_view WeightClassName(WeightClass c);
WeightClass ClassifyWeight(std::string_view name);
// N of "model.layers.N....", or nullopt.
std::optional<int64_t> LayerIndexOf(std::string_view name);

// The format one class of weights takes.
struct PrecisionFormat {
  enum class Kind : uint8_t {
    kAuto,   // as stored (FP8 stays FP8), or converted to --dtype when that is not auto
    kDense,  // converted to `dtype` (f32 / bf16 / f16)
    kQuant,  // quantized per `quant` (int8 / int4 / fp8)
  };
  Kind kind = Kind::kAuto;
  DType dtype = DType::kF32;
  QuantSpec quant;

  static PrecisionFormat Auto() { return {}; }
  static PrecisionFormat Dense(DType d) { return {Kind::kDense, d, {}}; }
  static PrecisionFormat Quant(const QuantSpec& q) { return {Kind::kQuant, DType::kF32, q}; }
  // Canonical name: auto, f32, bf16, f16, int8, int8-row, int4, int4-g128, fp8.
  std::string Name() const;
  bool operator==(const PrecisionFormat& o) const { return Name() == o.Name(); }
};

// Parses one format name (aliases: stored/as-stored = auto, float32, bfloat16, float16, the
// --quant names). Errors list the accepted names.
Result<PrecisionFormat> ParsePrecisionFormat(std::string_view name);
std::string_view PrecisionFormatNames();

class PrecisionPolicy {
 public:
  // Everything as stored (the default when neither --quant nor --policy is given).
  PrecisionPolicy() = default;
  // static:FMT | dynamic | custom:KEY=FMT,... Errors begin with "--policy:" and list the accepted
  // classes or formats.
  static Result<PrecisionPolicy> Parse(std::string_view text);
  // The old --quant behaviour: projections quantized, lm_head only when `lm_head` is set.
  static PrecisionPolicy FromQuant(const QuantSpec& quant, bool lm_head);

  // The format for matrix `name` (Hugging Face naming).
  PrecisionFormat FormatFor(std::string_view name) const;
  const PrecisionFormat& ClassFormat(WeightClass c) const {
    return class_formats_[static_cast<int>(c)];
  }
  // Whether any matrix may be quantized (int8 / int4 / fp8).
  bool AnyQuantized() const;
  // One string per distinct effect: every class's format in a fixed order, then the layer
  // overrides, e.g. "embed=auto,attn=int8,mla=bf16,...,other=int8;layers.0-2=bf16".
  std::string Canonical() const;

 private:
  struct LayerOverride {
    int64_t first = 0, last = 0;
    std::optional<WeightClass> cls;  // nullopt: every in-layer projection class
    PrecisionFormat format;
  };
  std::array<PrecisionFormat, kNumWeightClasses> class_formats_{};
  std::vector<LayerOverride> layers_;  // later entries win
};

// The custom: text `dynamic` expands to.
std::string_view DynamicPolicyText();

// The policy the flags ask for: `policy` when not empty, else `quant` (+ `quant_lm_head`).
// Giving both a policy and --quant/--quant-lm-head is an error. Called by ParseWeightPlan.
Result<PrecisionPolicy> PolicyFromFlags(std::string_view quant, bool quant_lm_head,
                                        std::string_view policy);

}  // namespace dh
