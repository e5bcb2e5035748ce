// pipeswap — umbrella header: every host-side component. The CUDA backend
// (<pipeswap/backend/cuda.hpp>) and kernels (*.cuh) are included separately.
#pragma once

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
