#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_convert(int argc, char** argv) {
    std::fprintf(stderr, "qinfer convert: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
