// pipeswap — umbrella header: every host-side component. The CUDA backend
// (<pipeswap/backend/cuda.hpp>), kernels (*.cuh) and the JSON I/O of schedules
// (<pipeswap/schedule/json.hpp>, which needs nlohmann-json) are included separately.
#pragma once

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/labels.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>
