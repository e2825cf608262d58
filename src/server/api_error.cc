// OpenAI error bodies and the status/type/code table of reliability.md §3.1.
#include "server/api_error.h"

#include "server/json_util.h"

namespace dh::server {

ApiError BadRequest(std::string param, std::string message, std::optional<std::string> code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError InvalidJson(std::string message) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.code = "invalid_json";
  return e;
}

ApiError ModelNotFound(const std::string& served) {
  ApiError e;
  e.status = 404;
  e.message = "The model does not exist on this server; it serves: " + served;
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError Unauthorized() {
  ApiError e;
  e.status = 401;
  e.type = "authentication_error";
  e.message = "Missing or invalid API key (send 'Authorization: Bearer <key>')";
  e.code = "invalid_api_key";
  return e;
}

ApiError NotFoundRoute() {
  ApiError e;
  e.status = 404;
  e.type = "not_found_error";
  e.message = "Unknown route";
  e.code = "not_found";
  return e;
}

ApiError MethodNotAllowed() {
  ApiError e;
  e.status = 405;
  e.message = "Method not allowed on this route";
  e.code = "method_not_allowed";
  return e;
}

ApiError PayloadTooLarge(size_t limit) {
  ApiError e;
  e.status = 413;
  e.message = "Request body exceeds the limit of " + std::to_string(limit) + " bytes";
  e.code = "request_too_large";
  return e;
}

ApiError Overloaded() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = "The server is overloaded (request queue full); retry later";
  e.code = "server_overloaded";
  return e;
}

ApiError ShuttingDown() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = "The server is shutting down";
  e.code = "server_shutting_down";
  return e;
}

ApiError NotReady() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = "The model is still loading";
  e.code = "server_loading";
  return e;
}

ApiError InternalError(std::string message) {
  ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.message = std::move(message);
  e.code = "internal_error";
  return e;
}

ApiError FromStatus(const Status& status, std::optional<std::string> param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnsupported:
      return BadRequest(param.value_or(""), status.message());
    case StatusCode::kResourceExhausted:
      return Overloaded();
    default:
      return InternalError("Internal error while processing the request");
  }
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
