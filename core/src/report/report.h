// The report: one versioned JSON document with everything the engine can tell about a compiled
// callable. Schema: share/magpy-report.schema.json. Consumers: explain(), the kernel views,
// the profiler GUI, the tests.
#pragma once

#include "api/compiled_state.h"

#include <nlohmann/json.hpp>

namespace magpy {

constexpr int kReportSchemaVersion = 2;

// PRECONDITION: GIL held.
nlohmann::json make_report(const CompiledState& st);

}  // namespace magpy
