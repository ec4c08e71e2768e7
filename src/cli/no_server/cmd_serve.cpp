// `qinfer serve` in a build without the HTTP server (QINFER_SERVER=OFF, the
// default of the MinGW cross build, which has no cpp-httplib to link).
#include "cli/commands.h"
#include "common/error.h"

namespace qinfer::cli {

int cmd_serve(int, char**) {
    fail("serve: this qinfer was built without the HTTP server (QINFER_SERVER=OFF: cpp-httplib was not available)");
}

}  // namespace qinfer::cli
