// pipeswap — the torch backend (umbrella header). Needs torch's C++ headers; not included by
// <pipeswap/pipeswap.hpp>. Components:
//
//   <pipeswap/backend/torch/backend.hpp>    backend (CPU and CUDA), event, torch_error
//   <pipeswap/backend/torch/optimizer.hpp>  tensor_optimizer: the Optimizer concept over torch
//                                           tensors, the update left to a callback
//   <pipeswap/backend/torch/saved_tensors.hpp>  saved_tensors: the activation swap of what autograd
//                                           saves (pack/unpack hooks over activation_swap)
#pragma once

#include <pipeswap/backend/torch/backend.hpp>
#include <pipeswap/backend/torch/optimizer.hpp>
#include <pipeswap/backend/torch/saved_tensors.hpp>
