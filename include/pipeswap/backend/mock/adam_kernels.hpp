// pipeswap — the former place of the mock backend's Adam kernel policy.
//
// Deprecated: include <pipeswap/optim/mock/adam_kernels.hpp>. The policy moved under optim/ (an
// optimizer's kernels depend on the backend, not the backend on the optimizer); this header forwards
// to it so that existing programs keep compiling.
#pragma once

#include <pipeswap/optim/mock/adam_kernels.hpp>
