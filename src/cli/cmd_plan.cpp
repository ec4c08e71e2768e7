#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_plan(int argc, char** argv) {
    std::fprintf(stderr, "qinfer plan: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
