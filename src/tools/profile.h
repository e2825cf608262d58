// `deepharness profile`: where a forward step's time goes. The op totals a TracingBackend
// collected over a workload (backend/tracing_backend.h) become two tables per phase (prefill,
// decode): per op class and per layer type (the model's trace labels: attention.mla, ffn.moe,
// ...), each row with calls, total and mean time, share of the time in ops, and the achieved
// GB/s and GFLOP/s against the machine's measured read bandwidth and FMA peak, so the op
// furthest from its limit stands out.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/tracing_backend.h"

namespace dh::tools {

struct ProfileRow {
  std::string name;
  OpTotals totals;
  double share = 0;  // of the phase's time in ops
  double gbs = 0, gflops = 0;
  double bandwidth_fraction = -1, peak_fraction = -1;  // < 0: yardstick not measured
};

struct ProfilePhase {
  std::string name;                         // "prefill", "decode"
  double wall_seconds = 0;                  // the whole workload of the phase
  double op_seconds = 0;                    // inside backend ops
  std::vector<ProfileRow> by_op, by_layer;  // by total time, largest first
};

struct ProfileReport {
  std::string label;                          // the model and workload
  double bandwidth_gbs = 0, peak_gflops = 0;  // <= 0: not measured
  std::vector<ProfilePhase> phases;
};

// Groups `rows` by op and by label ("" becomes "other").
ProfilePhase SummarizeProfile(const std::string& name, double wall_seconds,
                              const std::vector<OpTotalsRow>& rows, double bandwidth_gbs,
                              double peak_gflops);

std::string FormatProfile(const ProfileReport& report);
nlohmann::json ProfileJson(const ProfileReport& report);

}  // namespace dh::tools
