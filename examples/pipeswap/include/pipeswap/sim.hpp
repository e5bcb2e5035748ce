// pipeswap — umbrella header of the simulator and the pipeswap command's pieces: the mock backend,
// the pipeline simulator, scenario files, the planner, reports and SVG charts, and the schedule JSON
// form. Needs nlohmann-json. The library itself is <pipeswap/pipeswap.hpp>.
#pragma once

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/schedule/json.hpp>
#include <pipeswap/sim/model.hpp>
#include <pipeswap/sim/pipeline.hpp>
#include <pipeswap/sim/plan.hpp>
#include <pipeswap/sim/plan_format.hpp>
#include <pipeswap/sim/plan_search.hpp>
#include <pipeswap/sim/moe.hpp>
#include <pipeswap/sim/report.hpp>
#include <pipeswap/sim/scenario.hpp>
#include <pipeswap/sim/scenario_json.hpp>
#include <pipeswap/sim/sized.hpp>
#include <pipeswap/sim/svg.hpp>
