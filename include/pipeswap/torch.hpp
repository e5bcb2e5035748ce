// pipeswap — the PyTorch integration (umbrella header), a floor above the runtimes and the torch
// backend. Needs torch's C++ headers; not included by <pipeswap/pipeswap.hpp>. Components:
//
//   <pipeswap/torch/optimizer.hpp>      tensor_optimizer: the Optimizer concept over torch tensors,
//                                       the update left to a callback
//   <pipeswap/torch/saved_tensors.hpp>  saved_tensors: the activation swap of what autograd saves
//                                       (pack/unpack hooks over activation_swap)
#pragma once

#include <pipeswap/backend/torch.hpp>
#include <pipeswap/torch/optimizer.hpp>
#include <pipeswap/torch/saved_tensors.hpp>
