#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_tokenize(int argc, char** argv) {
    std::fprintf(stderr, "qinfer tokenize: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
