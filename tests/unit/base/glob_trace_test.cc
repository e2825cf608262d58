// GlobMatch (base/glob.h) and the Tracer (base/trace.h): the JSON parses as the Chrome trace
// format, holds the recorded spans with their arguments, and stays within max_events.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/glob.h"
#include "base/trace.h"

namespace dh {
namespace {

TEST(GlobMatch, StarsQuestionMarksAndAlternatives) {
  EXPECT_TRUE(GlobMatch("*", "model.layers.0.mlp"));
  EXPECT_TRUE(GlobMatch("model.layers.*.mlp", "model.layers.12.mlp"));
  EXPECT_FALSE(GlobMatch("model.layers.*.mlp", "model.layers.12.mlp.gate"));
  EXPECT_TRUE(GlobMatch("model.layers.?.self_attn.*", "model.layers.3.self_attn.q_a_proj"));
  EXPECT_FALSE(GlobMatch("model.layers.?.self_attn.*", "model.layers.13.self_attn.q_a_proj"));
  EXPECT_TRUE(GlobMatchAny("logits,model.norm", "model.norm"));
  EXPECT_FALSE(GlobMatchAny("logits,model.norm", "model.norms"));
  EXPECT_TRUE(GlobMatch("model.layers.#.mlp", "model.layers.12.mlp"));
  EXPECT_FALSE(GlobMatch("model.layers.#.mlp", "model.layers.x.mlp"));
  EXPECT_TRUE(GlobMatch("*a*b*c", "xxaxxbxxbxc"));
  EXPECT_FALSE(GlobMatch("", "x"));
}

TEST(Tracer, SpansBecomeChromeTraceEventsWithArguments) {
  Tracer tracer(100, /*pid=*/3);
  SetTracer(&tracer);
  {
    TraceSpan outer("layer");
    ASSERT_TRUE(outer.active());
    outer.SetName("model.layers.0");
    EXPECT_STREQ(CurrentTraceLabel(), "layer");
    {
      TraceSpan inner("attention.mla");
      inner.SetArgs(JsonArg("note", "quote \" and \\ and \n"));
      EXPECT_STREQ(CurrentTraceLabel(), "attention.mla");
    }
    EXPECT_STREQ(CurrentTraceLabel(), "layer");
  }
  const auto t0 = Tracer::Clock::now();
  tracer.Async("request r1", "request", 7, t0, t0 + std::chrono::milliseconds(2),
               JsonArg("prompt_tokens", 5));
  SetTracer(nullptr);
  EXPECT_STREQ(CurrentTraceLabel(), "");

  const auto j = nlohmann::json::parse(tracer.ToJson());
  const auto& ev = j.at("traceEvents");
  ASSERT_EQ(ev.size(), 1u + 2 + 2);  // process name, two spans, async begin + end
  EXPECT_EQ(ev[0].at("ph"), "M");
  // Spans are recorded when they end: the inner one first.
  EXPECT_EQ(ev[1].at("name"), "attention.mla");
  EXPECT_EQ(ev[1].at("args").at("note"), "quote \" and \\ and \n");
  EXPECT_EQ(ev[2].at("name"), "model.layers.0");
  EXPECT_EQ(ev[2].at("cat"), "layer");
  EXPECT_EQ(ev[2].at("pid"), 3);
  EXPECT_LE(ev[2].at("ts").get<double>(), ev[1].at("ts").get<double>());
  EXPECT_GE(ev[2].at("dur").get<double>(), ev[1].at("dur").get<double>());
  EXPECT_EQ(ev[3].at("ph"), "b");
  EXPECT_EQ(ev[4].at("ph"), "e");
  EXPECT_EQ(ev[3].at("id"), ev[4].at("id"));
  EXPECT_NEAR(ev[4].at("ts").get<double>() - ev[3].at("ts").get<double>(), 2000.0, 1.0);
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 0);
}

TEST(Tracer, KeepsTheFirstMaxEventsAndCountsTheRest) {
  Tracer tracer(5);
  SetTracer(&tracer);
  for (int i = 0; i < 12; ++i) TraceSpan span("op");
  SetTracer(nullptr);
  const auto j = nlohmann::json::parse(tracer.ToJson());
  EXPECT_EQ(j.at("traceEvents").size(), 1u + 5);
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 7);
  EXPECT_EQ(tracer.dropped(), 7u);
}

TEST(Tracer, NoTracerNoSpan) {
  TraceSpan span("op");
  EXPECT_FALSE(span.active());
  EXPECT_STREQ(CurrentTraceLabel(), "");
}

}  // namespace
}  // namespace dh
