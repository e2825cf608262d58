// WeightPlan: the one parser of --dtype / --quant / --quant-lm-head / --policy (each error names
// its flag and value), the MLA mode names, and Canonical(), which the compile cache keys on.
#include "weights/weight_plan.h"

#include <gtest/gtest.h>

#include <string>

namespace dh {
namespace {

std::string ErrorOf(const WeightFlags& f) {
  auto p = ParseWeightPlan(f);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  return p.ok() ? "" : p.status().message();
}

TEST(WeightPlanTest, DTypeNamesAndAliases) {
  EXPECT_EQ(*ParseDTypeOption("auto"), std::nullopt);
  for (const char* s : {"float32", "f32"}) EXPECT_EQ(*ParseDTypeOption(s), DType::kF32) << s;
  for (const char* s : {"bfloat16", "bf16"}) EXPECT_EQ(*ParseDTypeOption(s), DType::kBF16) << s;
  for (const char* s : {"float16", "f16", "half"}) {
    EXPECT_EQ(*ParseDTypeOption(s), DType::kF16) << s;
  }
  auto bad = ParseDTypeOption("float64");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--dtype 'float64': expected auto, float32, bfloat16 or float16");
}

TEST(WeightPlanTest, MlaModeNamesRoundTrip) {
  for (MlaMode m : {MlaMode::kAuto, MlaMode::kNaive, MlaMode::kAbsorbed}) {
    EXPECT_EQ(*ParseMlaMode(MlaModeName(m)), m);
  }
  auto bad = ParseMlaMode("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "MLA mode 'fast': expected auto, naive or absorbed");
}

TEST(WeightPlanTest, DefaultFlagsLoadEverythingAsStored) {
  auto p = ParseWeightPlan({});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->dtype, std::nullopt);
  EXPECT_EQ(p->mla_mode, MlaMode::kAuto);
  EXPECT_FALSE(p->policy.AnyQuantized());
  EXPECT_EQ(p->Canonical(), WeightPlan().Canonical());
  EXPECT_EQ(p->Canonical().rfind("dtype=auto;embed=auto,", 0), 0u) << p->Canonical();
}

// --quant FORMAT,lm_head=FORMAT (issue 22): lm_head in its own format, the rest in the first.
TEST(WeightPlanTest, QuantWithLmHeadFormat) {
  auto p = ParseWeightPlan({.quant = "int4,lm_head=int8"});
  ASSERT_TRUE(p.ok()) << p.status().message();
  const PrecisionFormat up = p->policy.FormatFor("model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(up.kind, PrecisionFormat::Kind::kQuant);
  EXPECT_EQ(up.quant.format, WeightFormat::kInt4);
  const PrecisionFormat lm = p->policy.FormatFor("lm_head.weight");
  EXPECT_EQ(lm.kind, PrecisionFormat::Kind::kQuant);
  EXPECT_EQ(lm.quant.format, WeightFormat::kInt8);
  EXPECT_EQ(p->policy.FormatFor("model.embed_tokens.weight").kind, PrecisionFormat::Kind::kAuto);
  auto same = ParseWeightPlan({.policy = "custom:default=int4,lm_head=int8"});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(p->Canonical(), same->Canonical());
  EXPECT_EQ(ErrorOf({.quant = "int4,head=int8"}),
            "--quant 'int4,head=int8': expected FORMAT or FORMAT,lm_head=FORMAT");
  EXPECT_NE(ErrorOf({.quant = "int4,lm_head=int3"}).find("unknown format 'int3'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({.quant = "int4,lm_head=int8", .quant_lm_head = true}).find("--quant-lm-head"),
            std::string::npos);
}

TEST(WeightPlanTest, FlagsBecomeTypedValues) {
  auto p = ParseWeightPlan({.dtype = "half", .quant = "int4-g128"});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->dtype, DType::kF16);
  const PrecisionFormat up = p->policy.FormatFor("model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(up.kind, PrecisionFormat::Kind::kQuant);
  EXPECT_EQ(up.quant.format, WeightFormat::kInt4);
  EXPECT_EQ(up.quant.group_size, 128);
  EXPECT_EQ(p->policy.FormatFor("lm_head.weight").kind, PrecisionFormat::Kind::kAuto);
  auto lm = ParseWeightPlan({.quant = "int8", .quant_lm_head = true});
  ASSERT_TRUE(lm.ok());
  EXPECT_EQ(lm->policy.FormatFor("lm_head.weight").quant.format, WeightFormat::kInt8);
}

TEST(WeightPlanTest, ErrorsNameTheFlagAndValue) {
  EXPECT_EQ(ErrorOf({.dtype = "f64"}).rfind("--dtype 'f64': expected", 0), 0u);
  const std::string q = ErrorOf({.quant = "int3"});
  EXPECT_EQ(q.rfind("--quant: unknown value 'int3'", 0), 0u) << q;
  const std::string p = ErrorOf({.policy = "static:int5"});
  EXPECT_EQ(p.rfind("--policy:", 0), 0u) << p;
  EXPECT_NE(p.find("int5"), std::string::npos) << p;
  EXPECT_NE(ErrorOf({.quant = "int8", .policy = "dynamic"}).find("are both given"),
            std::string::npos);
  // The dtype is checked first, whatever else is wrong.
  EXPECT_EQ(ErrorOf({.dtype = "x", .quant = "y"}).rfind("--dtype 'x'", 0), 0u);
}

TEST(WeightPlanTest, CanonicalIgnoresSpellingAndMlaMode) {
  auto a = ParseWeightPlan({.dtype = "bf16", .quant = "int8"});
  auto b = ParseWeightPlan({.dtype = "bfloat16", .policy = "custom:default=int8-g32,lm_head=auto"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->Canonical(), b->Canonical());
  b->mla_mode = MlaMode::kNaive;  // an attention path, not a weight format
  EXPECT_EQ(a->Canonical(), b->Canonical());
  auto c = ParseWeightPlan({.dtype = "bf16", .quant = "int8-row"});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->Canonical(), c->Canonical());
  auto d = ParseWeightPlan({.dtype = "f16", .quant = "int8"});
  ASSERT_TRUE(d.ok());
  EXPECT_NE(a->Canonical(), d->Canonical());
}

}  // namespace
}  // namespace dh
