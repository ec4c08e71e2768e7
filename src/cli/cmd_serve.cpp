#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_serve(int argc, char** argv) {
    std::fprintf(stderr, "qinfer serve: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
