#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_run(int argc, char** argv) {
    std::fprintf(stderr, "qinfer run: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
