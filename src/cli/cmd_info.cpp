#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_info(int argc, char** argv) {
    std::fprintf(stderr, "qinfer info: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
