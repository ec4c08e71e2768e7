#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_quantize(int argc, char** argv) {
    std::fprintf(stderr, "qinfer quantize: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
