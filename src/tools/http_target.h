// The address of an OpenAI-compatible server as the client tools take it (`bench serve --url`,
// `eval --url`, `compare --a/--b`), and the message of the error bodies such servers send.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dh {

struct HttpTarget {
  std::string base;    // http://host:port
  std::string prefix;  // path prefix before /v1 (usually empty; a trailing "/v1" is dropped)
};

// http://HOST:PORT[/PREFIX][/v1]. Otherwise an error naming the option:
// "<flag>: '<url>': expected http://HOST:PORT<alternatives>".
Result<HttpTarget> ParseHttpTarget(const std::string& url, std::string_view flag,
                                   std::string_view alternatives = {});

// error.message of an OpenAI error body (or a bare string `error`), else the body's first 200
// bytes.
std::string ServerErrorMessage(const std::string& body);

}  // namespace dh
