// diff-dumps (tools/dump_diff.h) on hand-made dumps: numpy.allclose semantics at the boundary,
// the first differing tap in A's order, integer taps compared exactly, taps in one dump only,
// and malformed manifests refused with the file and line named.
#include "tools/dump_diff.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/npy.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

class DumpDiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("dh_dump_diff_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "a");
    fs::create_directories(root_ / "b");
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes tap `name` of step `step` into dump `dir` and its manifest line.
  void Put(const std::string& dir, int step, const std::string& name, std::vector<float> v) {
    const std::string file = "s" + std::to_string(step) + "." + name + ".npy";
    const int64_t shape[] = {static_cast<int64_t>(v.size())};
    ASSERT_TRUE(WriteNpy((root_ / dir / file).string(), DType::kF32, v.data(), shape).ok());
    Line(dir,
         std::to_string(step) + "\t" + name + "\tf32\t" + std::to_string(v.size()) + "\t" + file);
  }
  void PutIds(const std::string& dir, int step, const std::string& name, std::vector<int32_t> v) {
    const std::string file = "s" + std::to_string(step) + "." + name + ".npy";
    const int64_t shape[] = {static_cast<int64_t>(v.size())};
    ASSERT_TRUE(WriteNpy((root_ / dir / file).string(), DType::kI32, v.data(), shape).ok());
    Line(dir,
         std::to_string(step) + "\t" + name + "\ti32\t" + std::to_string(v.size()) + "\t" + file);
  }
  void Line(const std::string& dir, const std::string& line) {
    const fs::path m = root_ / dir / "manifest.tsv";
    const bool fresh = !fs::exists(m);
    std::ofstream f(m, std::ios::app);
    if (fresh) f << "step\ttap\tdtype\tshape\tfile\n";
    f << line << "\n";
  }
  Result<DumpDiff> Diff(DumpDiffOptions o = {}) {
    return DiffDumps((root_ / "a").string(), (root_ / "b").string(), o);
  }

  fs::path root_;
};

TEST_F(DumpDiffTest, EqualDumpsMatch) {
  Put("a", 0, "model.embed_tokens", {1, 2, 3});
  Put("b", 0, "model.embed_tokens", {1, 2, 3});
  auto d = Diff();
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(d->same());
  EXPECT_NE(FormatDumpDiff(*d, {}).find("all 1 taps in both dumps match"), std::string::npos);
}

TEST_F(DumpDiffTest, AllcloseBoundaryIsInclusiveAndRelativeToB) {
  // |a - b| = 0.5. rtol 0.5: 0.5 <= 0.5 * |b| passes (inclusive). rtol 0.4: 0.4 * |b| = 0.4
  // fails, where a tolerance relative to |a| (0.6) would have passed.
  Put("a", 0, "t", {1.5f});
  Put("b", 0, "t", {1.0f});
  EXPECT_TRUE(Diff({.rtol = 0.5, .atol = 0})->same());
  EXPECT_FALSE(Diff({.rtol = 0.4, .atol = 0})->same());
  EXPECT_TRUE(Diff({.rtol = 0, .atol = 0.5})->same());
}

TEST_F(DumpDiffTest, NamesTheFirstDifferingTapInOrder) {
  Put("a", 0, "model.embed_tokens", {1, 2});
  Put("a", 0, "model.layers.0.self_attn.q_a_proj", {1, 2});
  Put("a", 0, "model.layers.0.mlp", {5, 6});
  Put("b", 0, "model.layers.0.mlp", {5, 7});  // B's order differs: A's decides
  Put("b", 0, "model.embed_tokens", {1, 2});
  Put("b", 0, "model.layers.0.self_attn.q_a_proj", {1, 2.5});
  auto d = Diff();
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(d->same());
  const TapDiff& first = d->taps[d->first_difference];
  EXPECT_EQ(first.tap, "model.layers.0.self_attn.q_a_proj");
  EXPECT_EQ(first.mismatched, 1);
  EXPECT_NEAR(first.max_abs, 0.5, 1e-7);
  EXPECT_NEAR(first.max_rel, 0.2, 1e-7);
  const std::string text = FormatDumpDiff(*d, {});
  EXPECT_NE(text.find("first differing tap: step 0 model.layers.0.self_attn.q_a_proj"),
            std::string::npos)
      << text;
}

TEST_F(DumpDiffTest, NanNeverMatchesAndSameSignInfinityDoes) {
  Put("a", 0, "inf", {INFINITY, -INFINITY});
  Put("b", 0, "inf", {INFINITY, -INFINITY});
  EXPECT_TRUE(Diff()->same());
  Put("a", 1, "nan", {NAN});
  Put("b", 1, "nan", {NAN});
  EXPECT_FALSE(Diff()->same());
}

TEST_F(DumpDiffTest, ChosenExpertsAreComparedExactly) {
  PutIds("a", 0, "model.layers.1.mlp.gate.topk_idx", {3, 5});
  PutIds("b", 0, "model.layers.1.mlp.gate.topk_idx", {3, 4});
  EXPECT_FALSE(Diff({.rtol = 1, .atol = 10})->same());
}

TEST_F(DumpDiffTest, ShapeDifferenceIsADifference) {
  Put("a", 0, "t", {1, 2});
  Put("b", 0, "t", {1, 2, 3});
  auto d = Diff();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->taps[0].verdict, TapDiff::Verdict::kShapeDiffers);
  EXPECT_EQ(d->taps[0].shape, "2 vs 3");
}

TEST_F(DumpDiffTest, TapsInOneDumpOnlyAreListedNotCompared) {
  Put("a", 0, "model.layers.0.self_attn.o_proj", {1});  // a tensor-parallel run has no o_proj
  Put("a", 0, "logits", {1, 2});
  Put("b", 0, "logits", {1, 2});
  Put("b", 1, "logits", {3});
  auto d = Diff();
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->same());
  EXPECT_EQ(d->only_in_a, std::vector<std::string>{"s0.model.layers.0.self_attn.o_proj"});
  EXPECT_EQ(d->only_in_b, std::vector<std::string>{"s1.logits"});
}

TEST_F(DumpDiffTest, BadInputIsRefusedWithTheFileNamed) {
  auto missing = Diff();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("manifest.tsv"), std::string::npos);

  Put("a", 0, "t", {1});
  Line("b", "0\tt\tf32");  // 3 fields
  auto short_line = Diff();
  ASSERT_FALSE(short_line.ok());
  EXPECT_NE(short_line.status().message().find("line 2: expected 5 tab-separated fields"),
            std::string::npos)
      << short_line.status().message();

  fs::remove(root_ / "b" / "manifest.tsv");
  Line("b", "0\tt\tf32\t1\t../escape.npy");
  auto escape = Diff();
  ASSERT_FALSE(escape.ok());
  EXPECT_NE(escape.status().message().find("field 'file'"), std::string::npos);

  fs::remove(root_ / "b" / "manifest.tsv");
  Put("b", 5, "other", {1});
  auto disjoint = Diff();
  ASSERT_FALSE(disjoint.ok());
  EXPECT_NE(disjoint.status().message().find("no tap"), std::string::npos);

  EXPECT_FALSE(Diff({.rtol = -1, .atol = 0}).ok());
}

}  // namespace
}  // namespace dh
