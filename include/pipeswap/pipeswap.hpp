// pipeswap — umbrella header: the library. Backend concepts, core, optimizers, the swap runtimes,
// schedules and activation swapping; needs no JSON library.
//
// Included separately: the CUDA backend (<pipeswap/backend/cuda.hpp>) and kernels (*.cuh); the torch
// backend (<pipeswap/backend/torch.hpp>, needs torch's headers); the mock backend
// (<pipeswap/backend/mock.hpp>); optimizer checkpoints (<pipeswap/swap/checkpoint.hpp>) and
// the safetensors file layer (<pipeswap/io/safetensors.hpp>), which parse JSON headers; the schedule
// JSON form (<pipeswap/schedule/json.hpp>); the MPI and NCCL comms (<pipeswap/exec/mpi_comm.hpp>,
// <pipeswap/exec/nccl_comm.hpp>); the simulator and the command's pieces (<pipeswap/sim.hpp>).
#pragma once

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/core/ieee_ops.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/exec/comm.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/exec/stage.hpp>
#include <pipeswap/exec/thread_comm.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/labels.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/schedule/step.hpp>
#include <pipeswap/schedule/text.hpp>
#include <pipeswap/schedule/validate.hpp>
#include <pipeswap/swap/instantiate.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/slot.hpp>
