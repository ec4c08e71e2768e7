#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_bench(int argc, char** argv) {
    std::fprintf(stderr, "qinfer bench: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
