// Output formats of `deepharness scan`: text (a table with totals and an effort range), JSON,
// CSV, SARIF 2.1.0 (for code-scanning services) and Markdown.
#pragma once

#include <string>
#include <string_view>

#include "scan/scanner.h"

namespace dh::scan {

enum class Format { kText, kJson, kCsv, kSarif, kMarkdown };

bool ParseFormat(std::string_view s, Format* f);

std::string FormatReport(const ScanReport& report, Format format);

// --fail-on: "none" (default), "any", "partial" (partial or costly on the target), "costly",
// "error" (severity error). True when some finding reaches the level.
bool ParseFailOn(std::string_view s);
bool FailsOn(const ScanReport& report, std::string_view level);

}  // namespace dh::scan
