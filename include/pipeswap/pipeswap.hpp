// pipeswap — umbrella header: every host-side component. The CUDA backend
// (<pipeswap/backend/cuda.hpp>) and kernels (*.cuh) are included separately.
#pragma once

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/slot.hpp>
#include <pipeswap/activation/activation_swap.hpp>
