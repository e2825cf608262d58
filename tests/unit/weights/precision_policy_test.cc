// The --policy parser (good strings, bad strings and their messages), the classification of
// every Hugging Face weight name pattern, the precedence of class, attn, default and layer keys,
// and the canonical string the compile cache keys on.
#include "weights/precision_policy.h"

#include <gtest/gtest.h>

#include "weights/weight_plan.h"

namespace dh {
namespace {

std::string FormatOf(const PrecisionPolicy& p, const std::string& name) {
  return p.FormatFor(name).Name();
}

PrecisionPolicy MustParse(const std::string& text) {
  auto p = PrecisionPolicy::Parse(text);
  EXPECT_TRUE(p.ok()) << text << ": " << p.status().message();
  return p.ok() ? *p : PrecisionPolicy();
}

// The message of a policy that must fail.
std::string ErrorOf(const std::string& text) {
  auto p = PrecisionPolicy::Parse(text);
  EXPECT_FALSE(p.ok()) << text << " parsed";
  return p.ok() ? std::string() : p.status().message();
}

TEST(PrecisionPolicyTest, ClassifiesEveryNamePattern) {
  const struct {
    const char* name;
    WeightClass cls;
  } kCases[] = {
      {"model.embed_tokens.weight", WeightClass::kEmbed},
      {"lm_head.weight", WeightClass::kLmHead},
      {"model.layers.0.self_attn.q_proj.weight", WeightClass::kAttn},
      {"model.layers.1.self_attn.k_proj.weight", WeightClass::kAttn},
      {"model.layers.2.self_attn.v_proj.weight", WeightClass::kAttn},
      {"model.layers.3.self_attn.o_proj.weight", WeightClass::kAttn},
      {"model.layers.0.self_attn.q_a_proj.weight", WeightClass::kMla},
      {"model.layers.0.self_attn.q_b_proj.weight", WeightClass::kMla},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", WeightClass::kMla},
      {"model.layers.60.self_attn.kv_b_proj.weight", WeightClass::kMla},
      {"model.layers.0.mlp.gate_proj.weight", WeightClass::kMlp},
      {"model.layers.0.mlp.up_proj.weight", WeightClass::kMlp},
      {"model.layers.0.mlp.down_proj.weight", WeightClass::kMlp},
      {"model.layers.5.mlp.experts.0.gate_proj.weight", WeightClass::kExperts},
      {"model.layers.5.mlp.experts.255.up_proj.weight", WeightClass::kExperts},
      {"model.layers.5.mlp.experts.17.down_proj.weight", WeightClass::kExperts},
      {"model.layers.5.mlp.shared_experts.gate_proj.weight", WeightClass::kShared},
      {"model.layers.5.mlp.shared_experts.down_proj.weight", WeightClass::kShared},
      {"model.layers.5.mlp.gate.weight", WeightClass::kGate},
      {"model.norm.weight", WeightClass::kOther},
      {"model.layers.x.mlp.up_proj.weight", WeightClass::kOther},
      {"something.else.weight", WeightClass::kOther},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(WeightClassName(ClassifyWeight(c.name)), WeightClassName(c.cls)) << c.name;
  }
  EXPECT_EQ(LayerIndexOf("model.layers.12.mlp.gate.weight"), 12);
  EXPECT_EQ(LayerIndexOf("model.embed_tokens.weight"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.layers.-1.mlp.gate.weight"), std::nullopt);
}

TEST(PrecisionPolicyTest, DefaultKeepsEverythingAsStored) {
  PrecisionPolicy p;
  EXPECT_FALSE(p.AnyQuantized());
  for (const char* n : {"model.embed_tokens.weight", "lm_head.weight",
                        "model.layers.3.mlp.experts.1.up_proj.weight"}) {
    EXPECT_EQ(FormatOf(p, n), "auto") << n;
  }
}

TEST(PrecisionPolicyTest, StaticSetsProjectionsNotEmbeddingsOrRouter) {
  const PrecisionPolicy p = MustParse("static:int4");
  EXPECT_TRUE(p.AnyQuantized());
  EXPECT_EQ(FormatOf(p, "model.layers.0.self_attn.q_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.0.self_attn.kv_b_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.0.mlp.down_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.4.mlp.experts.3.up_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.4.mlp.shared_experts.up_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "lm_head.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.embed_tokens.weight"), "auto");
  EXPECT_EQ(FormatOf(p, "model.layers.4.mlp.gate.weight"), "auto");
  EXPECT_EQ(FormatOf(MustParse("static:fp8"), "lm_head.weight"), "fp8");
  EXPECT_EQ(FormatOf(MustParse("static:bfloat16"), "lm_head.weight"), "bf16");
  EXPECT_EQ(FormatOf(MustParse("static:int4-g128"), "lm_head.weight"), "int4-g128");
  EXPECT_EQ(FormatOf(MustParse("static:int8-row"), "lm_head.weight"), "int8-row");
  EXPECT_EQ(FormatOf(MustParse("static:int8-g32"), "lm_head.weight"), "int8");
  EXPECT_FALSE(MustParse("static:bf16").AnyQuantized());
}

TEST(PrecisionPolicyTest, CustomFromTheIssue) {
  const PrecisionPolicy p =
      MustParse("custom:attn=bf16,experts=int4,shared=int8,gate=f32,lm_head=int8");
  EXPECT_EQ(FormatOf(p, "model.layers.0.self_attn.o_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(p, "model.layers.0.self_attn.q_a_proj.weight"), "bf16");  // attn covers mla
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.experts.7.down_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.shared_experts.down_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.gate.weight"), "f32");
  EXPECT_EQ(FormatOf(p, "lm_head.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "model.layers.0.mlp.up_proj.weight"), "auto");  // not named
  EXPECT_EQ(FormatOf(p, "model.embed_tokens.weight"), "auto");
}

TEST(PrecisionPolicyTest, NamedClassBeatsAttnBeatsDefaultInAnyOrder) {
  for (const char* text : {"custom:mla=f16,attn=int8,default=int4,embed=bf16",
                           "custom:default=int4, attn=int8 ,embed=bfloat16,mla=float16"}) {
    const PrecisionPolicy p = MustParse(text);
    EXPECT_EQ(FormatOf(p, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"), "f16") << text;
    EXPECT_EQ(FormatOf(p, "model.layers.1.self_attn.q_proj.weight"), "int8") << text;
    EXPECT_EQ(FormatOf(p, "model.layers.1.mlp.experts.0.up_proj.weight"), "int4") << text;
    EXPECT_EQ(FormatOf(p, "lm_head.weight"), "int4") << text;
    EXPECT_EQ(FormatOf(p, "model.layers.1.mlp.gate.weight"), "auto") << text;
    EXPECT_EQ(FormatOf(p, "model.embed_tokens.weight"), "bf16") << text;
  }
  EXPECT_EQ(MustParse("custom:mla=f16,attn=int8,default=int4,embed=bf16").Canonical(),
            MustParse("custom:default=int4, attn=int8 ,embed=bfloat16,mla=float16").Canonical());
}

TEST(PrecisionPolicyTest, LayerOverrides) {
  const PrecisionPolicy p = MustParse(
      "custom:default=int4,layers.0-1=bf16,layers.1.experts=int8,layers.3.gate=f16,"
      "layers.5.attn=fp8");
  EXPECT_EQ(FormatOf(p, "model.layers.0.self_attn.q_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(p, "model.layers.1.mlp.experts.2.up_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "model.layers.1.mlp.shared_experts.up_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(p, "model.layers.1.mlp.gate.weight"), "auto");  // class-less: not the router
  EXPECT_EQ(FormatOf(p, "model.layers.2.self_attn.q_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.gate.weight"), "f16");
  EXPECT_EQ(FormatOf(p, "model.layers.5.self_attn.kv_b_proj.weight"), "fp8");
  EXPECT_EQ(FormatOf(p, "model.layers.5.mlp.down_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "lm_head.weight"), "int4");
  // A class-specific override beats a class-less one whatever the order.
  const PrecisionPolicy q = MustParse("custom:layers.2.mlp=int8,layers.0-9=bf16");
  EXPECT_EQ(FormatOf(q, "model.layers.2.mlp.up_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(q, "model.layers.3.mlp.up_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(q, "model.layers.10.mlp.up_proj.weight"), "auto");
  EXPECT_NE(p.Canonical().find(";layers.0-1=bf16;layers.1-1.experts=int8"), std::string::npos)
      << p.Canonical();
}

TEST(PrecisionPolicyTest, DynamicRule) {
  const PrecisionPolicy p = MustParse("dynamic");
  EXPECT_EQ(FormatOf(p, "model.embed_tokens.weight"), "auto");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.gate.weight"), "f32");
  EXPECT_EQ(FormatOf(p, "model.layers.3.self_attn.kv_b_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(p, "model.layers.3.self_attn.o_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.experts.0.up_proj.weight"), "int4");
  EXPECT_EQ(FormatOf(p, "model.layers.3.mlp.shared_experts.up_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "model.layers.0.mlp.up_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(p, "lm_head.weight"), "int8");
  EXPECT_EQ(p.Canonical(), MustParse(std::string(DynamicPolicyText())).Canonical());
}

TEST(PrecisionPolicyTest, BadPoliciesNameTheProblemAndTheChoices) {
  std::string e = ErrorOf("custom:attention=int8");
  EXPECT_NE(e.find("--policy: unknown class 'attention'"), std::string::npos) << e;
  EXPECT_NE(e.find("experts, shared, gate, lm_head"), std::string::npos) << e;
  e = ErrorOf("custom:experts=int3");
  EXPECT_NE(e.find("unknown format 'int3'"), std::string::npos) << e;
  EXPECT_NE(e.find("int4-g128, fp8"), std::string::npos) << e;
  e = ErrorOf("static:int5");
  EXPECT_NE(e.find("unknown format 'int5'"), std::string::npos) << e;
  e = ErrorOf("static:none");
  EXPECT_NE(e.find("unknown format 'none'"), std::string::npos) << e;
  e = ErrorOf("custom:embed=int8");
  EXPECT_NE(e.find("embed=int8: the embedding table needs a dense format"), std::string::npos) << e;
  e = ErrorOf("custom:default=int8,embed=fp8");
  EXPECT_NE(e.find("embed=fp8"), std::string::npos) << e;
  e = ErrorOf("custom:gate=f32,gate=bf16");
  EXPECT_NE(e.find("class 'gate' is given twice"), std::string::npos) << e;
  e = ErrorOf("custom:attn");
  EXPECT_NE(e.find("'attn' in 'custom:attn' is not KEY=FORMAT"), std::string::npos) << e;
  e = ErrorOf("custom:");
  EXPECT_NE(e.find("is not KEY=FORMAT"), std::string::npos) << e;
  e = ErrorOf("custom:attn=int8,");
  EXPECT_NE(e.find("is not KEY=FORMAT"), std::string::npos) << e;
  e = ErrorOf("int8");
  EXPECT_NE(e.find("'int8' is not a policy (expected static:FORMAT, dynamic or custom:"),
            std::string::npos)
      << e;
  e = ErrorOf("Dynamic");
  EXPECT_NE(e.find("is not a policy"), std::string::npos) << e;
  for (const char* range : {"custom:layers.3-1=bf16", "custom:layers.a=bf16", "custom:layers.=bf16",
                            "custom:layers.1-=bf16"}) {
    e = ErrorOf(range);
    EXPECT_NE(e.find("expected layers.A-B or layers.N"), std::string::npos) << range << ": " << e;
  }
  e = ErrorOf("custom:layers.0.lm_head=int8");
  EXPECT_NE(e.find("unknown in-layer class 'lm_head'"), std::string::npos) << e;
}

TEST(PrecisionPolicyTest, FlagsPickQuantOrPolicy) {
  WeightFlags o;
  auto policy = [&o]() -> Result<PrecisionPolicy> {
    DH_ASSIGN_OR_RETURN(WeightPlan p, ParseWeightPlan(o));
    return p.policy;
  };
  auto none = policy();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->AnyQuantized());

  o.quant = "int8";
  auto quant = policy();
  ASSERT_TRUE(quant.ok());
  EXPECT_EQ(FormatOf(*quant, "model.layers.0.mlp.up_proj.weight"), "int8");
  EXPECT_EQ(FormatOf(*quant, "lm_head.weight"), "auto");
  EXPECT_EQ(FormatOf(*quant, "model.layers.2.mlp.gate.weight"), "auto");
  EXPECT_EQ(quant->Canonical(), MustParse("custom:default=int8,lm_head=auto").Canonical());
  o.quant_lm_head = true;
  EXPECT_EQ(policy()->Canonical(), MustParse("static:int8").Canonical());

  // A dense dtype as --quant converts the projections (compile --quant bf16).
  o.quant = "bf16";
  o.quant_lm_head = false;
  auto dense = policy();
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  EXPECT_EQ(FormatOf(*dense, "model.layers.0.mlp.up_proj.weight"), "bf16");
  EXPECT_EQ(FormatOf(*dense, "lm_head.weight"), "auto");
  EXPECT_FALSE(dense->AnyQuantized());
  o.quant_lm_head = true;
  EXPECT_EQ(policy()->Canonical(), MustParse("static:bf16").Canonical());
  o.quant = "int8";

  o.policy = "static:int4";
  auto both = policy();
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--policy 'static:int4' and --quant 'int8' are both"),
            std::string::npos)
      << both.status().message();
  o.quant = "none";
  auto lm = policy();
  ASSERT_FALSE(lm.ok());
  EXPECT_NE(lm.status().message().find("--quant-lm-head goes with --quant"), std::string::npos);
  o.quant_lm_head = false;
  ASSERT_TRUE(policy().ok());

  o.quant = "int9";
  o.policy.clear();
  auto bad = policy();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
}

TEST(PrecisionPolicyTest, CanonicalStringKeysOnEffectAndDtype) {
  auto canonical = [](const WeightFlags& f) -> Result<std::string> {
    DH_ASSIGN_OR_RETURN(WeightPlan p, ParseWeightPlan(f));
    return p.Canonical();
  };
  WeightFlags a, b;
  a.policy = "dynamic";
  b.policy = std::string(DynamicPolicyText());
  EXPECT_EQ(*canonical(a), *canonical(b));
  b.dtype = "bfloat16";
  EXPECT_NE(*canonical(a), *canonical(b));
  a.dtype = "bf16";
  EXPECT_EQ(*canonical(a), *canonical(b));
  EXPECT_EQ(canonical(a)->rfind("dtype=bf16;embed=auto,attn=int8,mla=bf16,", 0), 0u)
      << *canonical(a);
  WeightFlags q;
  q.quant = "int4";
  WeightFlags s;
  s.policy = "custom:default=int4-g32,lm_head=stored";
  EXPECT_EQ(*canonical(q), *canonical(s));
  s.dtype = "float64";
  EXPECT_FALSE(canonical(s).ok());
  s.dtype = "half";
  EXPECT_EQ(canonical(s)->rfind("dtype=f16;", 0), 0u);
}

}  // namespace
}  // namespace dh
