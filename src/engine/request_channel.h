// RequestChannel: the shared state between the engine thread (producer of RequestOutput deltas)
// and one RequestHandle (consumer). Pending deltas are merged, so the channel never grows with
// the number of steps a slow reader missed — only with the output itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "engine/types.h"

namespace dh::internal {

// Appends `delta` to `into` (deltas concatenate; status, usage and timing take the newest).
void MergeOutput(RequestOutput& into, RequestOutput&& delta);

struct RequestChannel {
  explicit RequestChannel(std::string request_id) : id(std::move(request_id)) {}

  // Engine side: publishes a delta (and wakes the reader).
  void Push(RequestOutput&& delta);
  // Asks for cancellation; `on_cancel` wakes the engine thread.
  void RequestCancel();

  const std::string id;
  std::atomic<bool> cancel_requested{false};
  std::function<void()> on_cancel;  // set before the handle is returned; never changed after

  std::mutex mu;
  std::condition_variable cv;
  RequestOutput pending;     // guarded by mu
  bool has_pending = false;  // guarded by mu
  bool finished = false;     // guarded by mu: the finished event was pushed
};

}  // namespace dh::internal
