// pipeswap — umbrella header: every host-side component. The CUDA backend
// (<pipeswap/backend/cuda.hpp>) and kernels (*.cuh) are included separately.
#pragma once

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/core/ieee_ops.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/atomic_file.hpp>
#include <pipeswap/io/error.hpp>
#include <pipeswap/io/safetensors.hpp>
#include <pipeswap/io/safetensors_format.hpp>
#include <pipeswap/io/safetensors_reader.hpp>
#include <pipeswap/io/safetensors_writer.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/json.hpp>
#include <pipeswap/schedule/labels.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/slot.hpp>
