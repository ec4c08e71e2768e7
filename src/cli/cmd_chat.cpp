#include <cstdio>

#include "cli/commands.h"

namespace qinfer::cli {

int cmd_chat(int argc, char** argv) {
    std::fprintf(stderr, "qinfer chat: not implemented yet\n");
    return 2;
}

}  // namespace qinfer::cli
