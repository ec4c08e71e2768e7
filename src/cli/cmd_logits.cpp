#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_logits(int argc, char** argv) {
    std::fprintf(stderr, "qinfer logits: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
