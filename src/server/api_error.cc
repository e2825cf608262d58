// OpenAI error bodies and the status/type/code table of reliability.md §3.1.
#include "server/api_error.h"

#include "server/json_util.h"

namespace dh::server {

namespace {
ApiError Make(int status, const char* type, std::string message, std::optional<std::string> code,
              std::optional<std::string> param = std::nullopt) {
  ApiError e;
  e.status = status;
  e.type = type;
  e.message = std::move(message);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}
constexpr const char* kInvalid = "invalid_request_error";
constexpr const char* kServer = "server_error";
}  // namespace

ApiError BadRequest(std::string param, std::string message, std::optional<std::string> code) {
  return Make(400, kInvalid, std::move(message), std::move(code), std::move(param));
}
ApiError InvalidJson(std::string message) {
  return Make(400, kInvalid, std::move(message), "invalid_json");
}
ApiError ModelNotFound(const std::string& served) {
  return Make(404, kInvalid, "The model does not exist on this server; it serves: " + served,
              "model_not_found", "model");
}
ApiError Unauthorized() {
  return Make(401, "authentication_error",
              "Missing or invalid API key (send 'Authorization: Bearer <key>')", "invalid_api_key");
}
ApiError NotFoundRoute() { return Make(404, "not_found_error", "Unknown route", "not_found"); }
ApiError MethodNotAllowed() {
  return Make(405, kInvalid, "Method not allowed on this route", "method_not_allowed");
}
ApiError PayloadTooLarge(size_t limit) {
  return Make(413, kInvalid,
              "Request body exceeds the limit of " + std::to_string(limit) + " bytes",
              "request_too_large");
}
ApiError RequestTimeout(int64_t seconds) {
  return Make(408, kInvalid,
              "Request headers not received within the read timeout (" + std::to_string(seconds) +
                  " s); closing the connection",
              "request_timeout");
}
ApiError Overloaded() {
  return Make(503, kServer, "The server is overloaded (request queue full); retry later",
              "server_overloaded");
}
ApiError ShuttingDown() {
  return Make(503, kServer, "The server is shutting down", "server_shutting_down");
}
ApiError NotReady() { return Make(503, kServer, "The model is still loading", "server_loading"); }
ApiError InternalError(std::string message) {
  return Make(500, kServer, std::move(message), "internal_error");
}

ApiError FromStatus(const Status& status, std::optional<std::string> param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnsupported:
      return BadRequest(param.value_or(""), status.message());
    case StatusCode::kResourceExhausted:
      return Overloaded();
    case StatusCode::kCancelled:  // the engine stopped (shutdown) while the request ran
      return ShuttingDown();
    default:
      return InternalError("Internal error while processing the request");
  }
}

ApiError FromEngineError(const Status& status) {
  if (status.code() == StatusCode::kCancelled) {
    // The engine's own stop says only that; a failed tensor-parallel job says which rank failed
    // and how (model/step_broadcast.h), which the client and its operator should see.
    if (status.message().rfind("engine ", 0) == 0) return ShuttingDown();
    return Make(503, kServer, "The server is shutting down: " + status.message(),
                "server_shutting_down");
  }
  return InternalError("The engine failed while generating");
}

std::string ErrorBody(const ApiError& error) {
  Json body = {{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", error.param && !error.param->empty() ? Json(*error.param) : Json()},
                 {"code", error.code ? Json(*error.code) : Json()}}}};
  return SafeDump(body);
}

}  // namespace dh::server
