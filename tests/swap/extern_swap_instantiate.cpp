// The one TU of test_extern_swap that instantiates the runtime declared extern in
// support/extern_swap.hpp (an explicit instantiation definition may follow the declaration).
#include "support/extern_swap.hpp"

PIPESWAP_INSTANTIATE_ADAM(pipeswap::test::extern_backend);
PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP(pipeswap::adamw<pipeswap::test::extern_backend>);
