// RequestHandle and RequestChannel: per-request result delivery between threads.
#include <utility>

#include "engine/engine.h"
#include "engine/request_channel.h"

namespace dh {
namespace internal {

void MergeOutput(RequestOutput& into, RequestOutput&& delta) {
  if (into.request_id.empty()) into.request_id = std::move(delta.request_id);
  into.token_ids.insert(into.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
  into.token_times.insert(into.token_times.end(), delta.token_times.begin(),
                          delta.token_times.end());
  for (auto& lp : delta.logprobs) into.logprobs.push_back(std::move(lp));
  into.text += delta.text;
  if (!delta.prompt_logprobs.empty()) into.prompt_logprobs = std::move(delta.prompt_logprobs);
  if (delta.finished) {
    into.finished = true;
    into.finish_reason = delta.finish_reason;
    into.stop_string = std::move(delta.stop_string);
    into.stop_token_id = delta.stop_token_id;
    into.error = std::move(delta.error);
  }
  into.usage = delta.usage;
  into.timing = delta.timing;
}

void RequestChannel::Push(RequestOutput&& delta) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;
    if (delta.finished) finished = true;
    MergeOutput(pending, std::move(delta));
    has_pending = true;
  }
  cv.notify_all();
}

void RequestChannel::RequestCancel() {
  if (cancel_requested.exchange(true)) return;
  if (on_cancel) on_cancel();
}

}  // namespace internal

RequestHandle::RequestHandle(std::shared_ptr<internal::RequestChannel> channel)
    : channel_(std::move(channel)) {}

RequestHandle::~RequestHandle() {
  bool done;
  {
    std::lock_guard<std::mutex> lock(channel_->mu);
    done = channel_->finished;
  }
  if (!done) channel_->RequestCancel();
}

const std::string& RequestHandle::request_id() const { return channel_->id; }

std::optional<RequestOutput> RequestHandle::Next(std::chrono::milliseconds timeout) {
  if (finished_read_) return std::nullopt;
  std::unique_lock<std::mutex> lock(channel_->mu);
  if (!channel_->cv.wait_for(lock, timeout, [&] { return channel_->has_pending; })) {
    return std::nullopt;
  }
  RequestOutput out = std::move(channel_->pending);
  channel_->pending = RequestOutput();
  channel_->has_pending = false;
  if (out.finished) finished_read_ = true;
  if (out.request_id.empty()) out.request_id = channel_->id;
  return out;
}

RequestOutput RequestHandle::WaitFinished() {
  RequestOutput all;
  all.request_id = channel_->id;
  while (!finished_read_) {
    auto next = Next(std::chrono::milliseconds(1000));
    if (next) internal::MergeOutput(all, std::move(*next));
  }
  return all;
}

void RequestHandle::Cancel() { channel_->RequestCancel(); }

bool RequestHandle::finished() const { return finished_read_; }

}  // namespace dh
