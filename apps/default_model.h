// Where the embedded model lives when --model-path is not given: models/shakespeare-v3 next to
// the installed binary (<bindir>/../models/... in a build tree, <bindir>/../share/deepharness/
// models/... after install), never relative to the current directory.
#pragma once

#include <string>

namespace dh::app {

inline constexpr const char kDefaultModelName[] = "shakespeare-v3";

// The first candidate directory that exists, or "" when none does.
std::string DefaultModelPath();
// The candidates, in search order (for error messages).
std::string DefaultModelCandidates();

}  // namespace dh::app
