// pipeswap — the torch backend (umbrella header): backend (CPU and CUDA), event, torch_error. Needs
// torch's C++ headers; not included by <pipeswap/pipeswap.hpp>. The PyTorch integrations built on it
// sit a floor higher, in <pipeswap/torch.hpp>.
#pragma once

#include <pipeswap/backend/torch/backend.hpp>
