// Precision policy parsing and name classification (see precision_policy.h).
#include "weights/precision_policy.h"

#include <charconv>

#include <fmt/format.h>


namespace dh {
namespace {

constexpr std::array<std::string_view, kNumWeightClasses> kClassNames = {
    "embed", "attn", "mla", "mlp", "experts", "shared", "gate", "lm_head", "other"};

// Classes `static:`, `default=` and a class-less `layers.A-B=` set.
constexpr WeightClass kProjectionClasses[] = {
    WeightClass::kAttn,   WeightClass::kMla,    WeightClass::kMlp,  WeightClass::kExperts,
    WeightClass::kShared, WeightClass::kLmHead, WeightClass::kOther};
constexpr WeightClass kInLayerProjections[] = {WeightClass::kAttn, WeightClass::kMla,
                                               WeightClass::kMlp, WeightClass::kExperts,
                                               WeightClass::kShared};

constexpr std::string_view kAcceptedKeys =
    "embed, attn (also sets mla), mla, mlp, experts, shared, gate, lm_head, other, default, "
    "layers.A-B or layers.A-B.CLASS";

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::optional<int64_t> ParseIndex(std::string_view s) {
  int64_t v = 0;
  if (s.empty() || s.size() > 9) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

std::optional<WeightClass> ClassByName(std::string_view s) {
  for (int i = 0; i < kNumWeightClasses; ++i) {
    if (kClassNames[i] == s) return static_cast<WeightClass>(i);
  }
  return std::nullopt;
}

bool IsInLayer(WeightClass c) {
  return c != WeightClass::kEmbed && c != WeightClass::kLmHead && c != WeightClass::kOther;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view WeightClassName(WeightClass c) { return kClassNames[static_cast<int>(c)]; }

std::optional<int64_t> LayerIndexOf(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!StartsWith(name, kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  return ParseIndex(name.substr(0, name.find('.')));
}

WeightClass ClassifyWeight(std::string_view name) {
  if (name == "model.embed_tokens.weight") return WeightClass::kEmbed;
  if (name == "lm_head.weight") return WeightClass::kLmHead;
  if (!LayerIndexOf(name)) return WeightClass::kOther;
  if (name.find(".self_attn.") != std::string_view::npos) {
    for (std::string_view p : {".q_a_proj.", ".q_b_proj.", ".kv_a_proj_with_mqa.", ".kv_b_proj."}) {
      if (name.find(p) != std::string_view::npos) return WeightClass::kMla;
    }
    return WeightClass::kAttn;
  }
  if (name.find(".mlp.experts.") != std::string_view::npos) return WeightClass::kExperts;
  if (name.find(".mlp.shared_experts.") != std::string_view::npos) return WeightClass::kShared;
  if (EndsWith(name, ".mlp.gate.weight")) return WeightClass::kGate;
  if (name.find(".mlp.") != std::string_view::npos) return WeightClass::kMlp;
  return WeightClass::kOther;
}

std::string PrecisionFormat::Name() const {
  switch (kind) {
    case Kind::kAuto:
      return "auto";
    case Kind::kDense:
      return std::string(DTypeName(dtype));
    case Kind::kQuant:
      if (quant.format == WeightFormat::kFp8Block) return "fp8";
      if (quant.format == WeightFormat::kInt8) return quant.group_size <= 0 ? "int8-row" : "int8";
      if (quant.format == WeightFormat::kInt4)
        return quant.group_size == 128 ? "int4-g128" : "int4";
      break;
  }
  return "?";
}

std::string_view PrecisionFormatNames() {
  return "auto (= stored, as-stored), f32 (= float32), bf16 (= bfloat16), f16 (= float16), "
         "int8 (= int8-g32), int8-row, int4 (= int4-g32), int4-g128, fp8";
}

Result<PrecisionFormat> ParsePrecisionFormat(std::string_view name) {
  if (name == "auto" || name == "stored" || name == "as-stored") return PrecisionFormat::Auto();
  if (name == "f32" || name == "float32") return PrecisionFormat::Dense(DType::kF32);
  if (name == "bf16" || name == "bfloat16") return PrecisionFormat::Dense(DType::kBF16);
  if (name == "f16" || name == "float16") return PrecisionFormat::Dense(DType::kF16);
  if (name != "none") {
    auto q = ParseQuantSpec(name);
    if (q.ok() && q->enabled) return PrecisionFormat::Quant(*q);
  }
  return InvalidArgument("--policy: unknown format '{}' (expected one of: {})", name,
                         PrecisionFormatNames());
}

std::string_view DynamicPolicyText() {
  return "custom:embed=auto,gate=f32,mla=bf16,attn=int8,mlp=int8,shared=int8,experts=int4,"
         "lm_head=int8,other=int8";
}

Result<PrecisionPolicy> PrecisionPolicy::Parse(std::string_view text) {
  const std::string_view original = text;
  if (text == "dynamic") return Parse(DynamicPolicyText());
  PrecisionPolicy p;
  if (StartsWith(text, "static:")) {
    DH_ASSIGN_OR_RETURN(PrecisionFormat f, ParsePrecisionFormat(text.substr(7)));
    for (WeightClass c : kProjectionClasses) p.class_formats_[static_cast<int>(c)] = f;
    return p;
  }
  if (!StartsWith(text, "custom:")) {
    return InvalidArgument(
        "--policy: '{}' is not a policy (expected static:FORMAT, dynamic or "
        "custom:CLASS=FORMAT,...)",
        original);
  }
  text.remove_prefix(7);
  // Precedence, whatever the order written: default < attn (over mla) < the named class.
  std::optional<PrecisionFormat> by_default, by_attn;
  std::array<std::optional<PrecisionFormat>, kNumWeightClasses> named;
  std::vector<std::string_view> items;
  for (size_t pos = 0;;) {
    const size_t comma = text.find(',', pos);
    items.push_back(Trim(text.substr(pos, comma == std::string_view::npos ? comma : comma - pos)));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  for (std::string_view item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgument("--policy: '{}' in '{}' is not KEY=FORMAT (keys: {})", item, original,
                             kAcceptedKeys);
    }
    const std::string_view key = Trim(item.substr(0, eq));
    DH_ASSIGN_OR_RETURN(PrecisionFormat f, ParsePrecisionFormat(Trim(item.substr(eq + 1))));
    if (StartsWith(key, "layers.")) {
      std::string_view rest = key.substr(7);
      const size_t dot = rest.find('.');
      const std::string_view range = rest.substr(0, dot);
      LayerOverride o;
      o.format = f;
      const size_t dash = range.find('-');
      auto first = ParseIndex(range.substr(0, dash));
      auto last = dash == std::string_view::npos ? first : ParseIndex(range.substr(dash + 1));
      if (!first || !last || *last < *first) {
        return InvalidArgument("--policy: '{}': expected layers.A-B or layers.N with 0 <= A <= B",
                               key);
      }
      o.first = *first;
      o.last = *last;
      if (dot != std::string_view::npos) {
        auto c = ClassByName(rest.substr(dot + 1));
        if (!c || !IsInLayer(*c)) {
          return InvalidArgument(
              "--policy: '{}': unknown in-layer class '{}' (expected one of: "
              "attn, mla, mlp, experts, shared, gate)",
              key, rest.substr(dot + 1));
        }
        o.cls = *c;
      }
      p.layers_.push_back(o);
      continue;
    }
    std::optional<PrecisionFormat>* slot = nullptr;
    if (key == "default") {
      slot = &by_default;
    } else if (key == "attn") {
      slot = &by_attn;
    } else if (auto c = ClassByName(key)) {
      slot = &named[static_cast<int>(*c)];
    } else {
      return InvalidArgument("--policy: unknown class '{}' in '{}' (expected one of: {})", key,
                             original, kAcceptedKeys);
    }
    if (slot->has_value()) {
      return InvalidArgument("--policy: class '{}' is given twice in '{}'", key, original);
    }
    *slot = f;
  }
  if (by_default) {
    for (WeightClass c : kProjectionClasses) p.class_formats_[static_cast<int>(c)] = *by_default;
  }
  if (by_attn) {
    p.class_formats_[static_cast<int>(WeightClass::kAttn)] = *by_attn;
    p.class_formats_[static_cast<int>(WeightClass::kMla)] = *by_attn;
  }
  for (int i = 0; i < kNumWeightClasses; ++i) {
    if (named[i]) p.class_formats_[i] = *named[i];
  }
  const PrecisionFormat& embed = p.ClassFormat(WeightClass::kEmbed);
  if (embed.kind == PrecisionFormat::Kind::kQuant) {
    return InvalidArgument(
        "--policy: embed={}: the embedding table needs a dense format (auto, "
        "f32, bf16 or f16)",
        embed.Name());
  }
  return p;
}

PrecisionPolicy PrecisionPolicy::FromQuant(const QuantSpec& quant, bool lm_head) {
  PrecisionPolicy p;
  if (!quant.enabled) return p;
  for (WeightClass c : kProjectionClasses) {
    if (c != WeightClass::kLmHead || lm_head) {
      p.class_formats_[static_cast<int>(c)] = PrecisionFormat::Quant(quant);
    }
  }
  return p;
}

PrecisionFormat PrecisionPolicy::FormatFor(std::string_view name) const {
  const WeightClass c = ClassifyWeight(name);
  PrecisionFormat f = ClassFormat(c);
  if (layers_.empty() || !IsInLayer(c)) return f;
  const int64_t layer = *LayerIndexOf(name);
  // Class-less overrides first, then class-specific ones, each in the order written.
  for (bool with_class : {false, true}) {
    for (const LayerOverride& o : layers_) {
      if (layer < o.first || layer > o.last || o.cls.has_value() != with_class) continue;
      const bool applies =
          with_class ? (*o.cls == c || (*o.cls == WeightClass::kAttn && c == WeightClass::kMla))
                     : c != WeightClass::kGate;
      if (applies) f = o.format;
    }
  }
  return f;
}

bool PrecisionPolicy::AnyQuantized() const {
  for (const auto& f : class_formats_) {
    if (f.kind == PrecisionFormat::Kind::kQuant) return true;
  }
  for (const auto& o : layers_) {
    if (o.format.kind == PrecisionFormat::Kind::kQuant) return true;
  }
  return false;
}

std::string PrecisionPolicy::Canonical() const {
  std::string s;
  for (int i = 0; i < kNumWeightClasses; ++i) {
    s += fmt::format("{}{}={}", i ? "," : "", kClassNames[i], class_formats_[i].Name());
  }
  for (const LayerOverride& o : layers_) {
    s += fmt::format(";layers.{}-{}{}{}={}", o.first, o.last, o.cls ? "." : "",
                     o.cls ? WeightClassName(*o.cls) : "", o.format.Name());
  }
  return s;
}

Result<PrecisionPolicy> PolicyFromFlags(std::string_view quant, bool quant_lm_head,
                                        std::string_view policy) {
  if (policy.empty()) {
    // --quant FORMAT,lm_head=FORMAT: the projections in one format, lm_head in another (e.g.
    // int4,lm_head=int8: lm_head is the largest single matrix a decode step reads).
    if (const size_t comma = quant.find(','); comma != std::string_view::npos) {
      const std::string_view head = quant.substr(0, comma), tail = quant.substr(comma + 1);
      constexpr std::string_view kLmHead = "lm_head=";
      if (!tail.starts_with(kLmHead) || tail.size() == kLmHead.size() || head.empty()) {
        return InvalidArgument("--quant '{}': expected FORMAT or FORMAT,lm_head=FORMAT", quant);
      }
      if (quant_lm_head) {
        return InvalidArgument("--quant '{}' names lm_head's format: drop --quant-lm-head", quant);
      }
      for (std::string_view f : {head, tail.substr(kLmHead.size())}) {
        if (!ParsePrecisionFormat(f).ok()) {
          return InvalidArgument("--quant '{}': unknown format '{}' (expected one of: {})", quant,
                                 f, QuantSpecNames());
        }
      }
      return PrecisionPolicy::Parse(
          fmt::format("custom:default={},lm_head={}", head, tail.substr(kLmHead.size())));
    }
    // --quant bf16|f16|f32 (as `compile --quant bf16` is written): every projection converted
    // to that dense dtype, lm_head only with --quant-lm-head, like the quantized formats.
    if (auto dense = ParsePrecisionFormat(quant);
        dense.ok() && dense->kind == PrecisionFormat::Kind::kDense) {
      return PrecisionPolicy::Parse(quant_lm_head
                                        ? fmt::format("static:{}", quant)
                                        : fmt::format("custom:default={},lm_head=auto", quant));
    }
    DH_ASSIGN_OR_RETURN(QuantSpec q, ParseQuantSpec(quant));
    return PrecisionPolicy::FromQuant(q, quant_lm_head);
  }
  if (!quant.empty() && quant != "none") {
    return InvalidArgument(
        "--policy '{}' and --quant '{}' are both given: use one (e.g. "
        "--policy static:{})",
        policy, quant, quant);
  }
  if (quant_lm_head) {
    return InvalidArgument("--quant-lm-head goes with --quant; with --policy write lm_head=FORMAT");
  }
  return PrecisionPolicy::Parse(policy);
}

}  // namespace dh
