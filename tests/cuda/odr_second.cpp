// A second translation unit that includes every CUDA backend header: a non-inline definition in any
// of them breaks the link of the executable this is part of.
#include <pipeswap/backend/cuda.hpp>

int odr_second_tu() {
  pipeswap::cuda::event const e;
  return (e.recorded() ? 1 : 0) + (pipeswap::cuda::legacy_stream().is_implicit() ? 0 : 1) +
         static_cast<int>(pipeswap::cuda::logged_error_count() > 1000000);
}
