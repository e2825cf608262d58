// SSE streaming for chat and completions: role delta first, then content / reasoning_content
// deltas as the engine produces text, a finish_reason chunk per choice, the optional usage
// chunk and `data: [DONE]`. A failed write or a dead connection cancels every engine request of
// the job at once (their KV blocks are freed at the next engine step).
#include <chrono>

#include "server/generation_internal.h"
#include "server/generation_tools.h"

namespace dh::server::internal {
namespace {

using namespace std::chrono_literals;

class StreamBase : public StreamJob {
 public:
  explicit StreamBase(std::shared_ptr<Job> job) : job_(std::move(job)) {}

  void Run(EventSink& sink) final {
    sink_ = &sink;
    if (!Start()) return Abandon();
    const auto poll = job_->choices.size() == 1 ? 50ms : 5ms;
    size_t remaining = job_->choices.size();
    while (remaining > 0) {
      for (ChoiceState& c : job_->choices) {
        if (c.finished) continue;
        auto out = c.handle->Next(poll);
        if (!out) continue;
        Absorb(c, RequestOutput(*out));
        if (!out->error.ok()) {
          Send(SseEvent(Json::parse(ErrorBody(FromEngineError(out->error)))));
          Send(kSseDone);
          return Abandon();
        }
        if (!OnOutput(c, *out)) return Abandon();
        if (c.finished) {
          --remaining;
          RecordChoice(*job_, c, false);
        }
      }
      if (sink_->alive && !sink_->alive()) return Abandon();
    }
    if (job_->stream.include_usage && !Send(SseEvent(UsageChunkJson(job_->meta, object(), TotalUsage(*job_)))))
      return;
    Send(kSseDone);
  }

 protected:
  virtual const char* object() const = 0;
  // Sends the opening events; false when the client is gone.
  virtual bool Start() = 0;
  // Sends what `out` (already absorbed into `c`) adds; false when the client is gone.
  virtual bool OnOutput(ChoiceState& c, const RequestOutput& out) = 0;

  bool Send(const std::string& event) { return sink_->write(event); }

  Json RunningUsage() const {
    if (!job_->stream.continuous_usage_stats) return nullptr;
    return UsageJson(TotalUsage(*job_));
  }

  std::shared_ptr<Job> job_;

 private:
  // The client went away (or the engine failed): cancel everything still running.
  void Abandon() {
    for (ChoiceState& c : job_->choices) {
      if (!c.finished) c.handle->Cancel();
      RecordChoice(*job_, c, !c.finished);
    }
  }

  EventSink* sink_ = nullptr;
};

class ChatStream : public StreamBase {
 public:
  using StreamBase::StreamBase;

 protected:
  const char* object() const override { return "chat.completion.chunk"; }

  bool Start() override {
    for (const ChoiceState& c : job_->choices) {
      ChatDelta delta;
      delta.role = true;
      delta.content = "";
      if (!Send(SseEvent(ChatChunkJson(job_->meta, c.index, delta, std::nullopt, nullptr, RunningUsage()))))
        return false;
    }
    return true;
  }

  bool OnOutput(ChoiceState& c, const RequestOutput& out) override {
    ChatDelta delta;
    if (job_->reasoning) {
      SplitDelta split = c.splitter.Push(out.text);
      if (c.finished) {
        SplitDelta rest = c.splitter.Finish();
        split.reasoning += rest.reasoning;
        split.content += rest.content;
      }
      if (!split.reasoning.empty() && job_->include_reasoning) delta.reasoning_content = split.reasoning;
      if (!split.content.empty()) delta.content = split.content;
    } else if (!out.text.empty()) {
      delta.content = out.text;
    }
    std::optional<std::string> reason = FinishReasonName(out.finish_reason);
    StreamToolDelta(*job_, c, c.finished, &delta, &reason);
    Json logprobs = nullptr;
    if (job_->sampling.logprobs && !out.logprobs.empty())
      logprobs = ChatLogprobsJson(ChatLogprobs(job_->tokenizer, out.logprobs));
    if (delta.content || delta.reasoning_content || !delta.tool_calls.is_null() || !logprobs.is_null()) {
      if (!Send(SseEvent(ChatChunkJson(job_->meta, c.index, delta, std::nullopt, logprobs, RunningUsage()))))
        return false;
    }
    if (c.finished) {
      if (!Send(SseEvent(ChatChunkJson(job_->meta, c.index, ChatDelta{}, reason, nullptr, RunningUsage()))))
        return false;
    }
    return true;
  }
};

class CompletionStream : public StreamBase {
 public:
  using StreamBase::StreamBase;

 protected:
  const char* object() const override { return "text_completion"; }

  bool Start() override {
    offsets_.assign(job_->choices.size(), 0);
    if (!job_->echo) return true;
    // The echoed prompt goes first, with prompt logprobs when asked (they arrive with the
    // first engine event, so only the text is sent here).
    for (const ChoiceState& c : job_->choices) {
      const std::string& text = job_->echo_text[c.prompt_index];
      offsets_[c.index] = static_cast<int64_t>(text.size());
      if (!Send(SseEvent(CompletionChunkJson(job_->meta, c.index, text, std::nullopt, nullptr, RunningUsage()))))
        return false;
    }
    return true;
  }

  bool OnOutput(ChoiceState& c, const RequestOutput& out) override {
    Json logprobs = nullptr;
    if (job_->completion_logprobs >= 0 && !out.logprobs.empty()) {
      std::vector<std::optional<dh::TokenLogprob>> entries(out.logprobs.begin(), out.logprobs.end());
      logprobs = CompletionLogprobsJson(CompletionLogprobs(job_->tokenizer, entries, &offsets_[c.index]));
    }
    if (!out.text.empty() || !logprobs.is_null()) {
      if (!Send(SseEvent(CompletionChunkJson(job_->meta, c.index, out.text, std::nullopt, logprobs, RunningUsage()))))
        return false;
    }
    if (c.finished) {
      std::optional<std::string> reason = FinishReasonName(out.finish_reason);
      if (!Send(SseEvent(CompletionChunkJson(job_->meta, c.index, "", reason, nullptr, RunningUsage()))))
        return false;
    }
    return true;
  }

 private:
  std::vector<int64_t> offsets_;
};

}  // namespace

std::unique_ptr<StreamJob> MakeChatStream(std::shared_ptr<Job> job) {
  return std::make_unique<ChatStream>(std::move(job));
}

std::unique_ptr<StreamJob> MakeCompletionStream(std::shared_ptr<Job> job) {
  return std::make_unique<CompletionStream>(std::move(job));
}

}  // namespace dh::server::internal
