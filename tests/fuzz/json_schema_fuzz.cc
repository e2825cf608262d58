// Fuzz target: the JSON-schema compiler of structured output (src/grammar), strict and lenient,
// compact and any-whitespace layouts.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_target.h"
#include "grammar/compilers.h"

DH_FUZZ_TARGET(json_schema) {
  const nlohmann::json schema = nlohmann::json::parse(
      std::string_view(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (schema.is_discarded()) return 0;
  for (bool strict : {true, false}) {
    dh::grammar::JsonSchemaOptions options;
    options.strict = strict;
    options.any_whitespace = !strict;
    std::vector<std::string> ignored;
    (void)dh::grammar::CompileJsonSchema(schema, options, &ignored);
  }
  return 0;
}
