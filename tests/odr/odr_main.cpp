// The program of the ODR check. tests/meson.build links every self-containment object (one public
// header each, the umbrella headers among them) into it whole, so a non-inline definition in a header
// that another public header includes appears in two objects and breaks the link. The headers that
// no other public header includes and that hold code are included here once more.
#include <pipeswap/swap/checkpoint.hpp>

int main() { return 0; }
