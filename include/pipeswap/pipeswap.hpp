// pipeswap — umbrella header: every host-side component. The CUDA backend
// (<pipeswap/backend/cuda.hpp>) and kernels (*.cuh) are included separately.
#pragma once

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/atomic_file.hpp>
#include <pipeswap/io/error.hpp>
#include <pipeswap/io/safetensors.hpp>
#include <pipeswap/io/safetensors_format.hpp>
#include <pipeswap/io/safetensors_reader.hpp>
#include <pipeswap/io/safetensors_writer.hpp>
