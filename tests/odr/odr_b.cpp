// Included in two translation units of one program: any non-inline definition in a header breaks the link.
#include "odr_all.hpp"

int odr_b() { return odr_probe(); }
