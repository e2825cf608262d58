// ApiError: an OpenAI-style error ({"error": {"message", "type", "param", "code"}}) with its HTTP
// status. Messages are fixed text plus validated field names; they never echo request bodies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace dh::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::optional<std::string> param;
  std::optional<std::string> code;
};

// 400 invalid_request_error naming `param` (code null unless given).
ApiError BadRequest(std::string param, std::string message,
                    std::optional<std::string> code = std::nullopt);
ApiError InvalidJson(std::string message);
ApiError ModelNotFound(const std::string& model_param_value_safe);
ApiError Unauthorized();
ApiError NotFoundRoute();
ApiError MethodNotAllowed();
ApiError PayloadTooLarge(size_t limit);
// 408 request_timeout: the header block did not arrive within `seconds` (the connection closes).
ApiError RequestTimeout(int64_t seconds);
ApiError Overloaded();      // 503 server_overloaded (send Retry-After)
ApiError ShuttingDown();    // 503 server_shutting_down
ApiError NotReady();        // 503 while loading
ApiError InternalError(std::string message);

// Maps a Status from the engine/tokenizer to an ApiError (InvalidArgument/OutOfRange -> 400,
// ResourceExhausted -> 503, Cancelled -> 499-style 400, everything else -> 500).
ApiError FromStatus(const Status& status, std::optional<std::string> param = std::nullopt);
// The error a request gets when the engine ended it with `status`: 503 server_shutting_down when
// the engine stopped (kCancelled at shutdown; with the reason when a tensor-parallel rank failed),
// else 500.
ApiError FromEngineError(const Status& status);

// The JSON body text for `error` (never throws, whatever bytes the message holds).
std::string ErrorBody(const ApiError& error);

}  // namespace dh::server
