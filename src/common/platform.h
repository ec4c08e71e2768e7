// Small OS seams: console UTF-8, UTF-8 argv on Windows, physical core count.
#pragma once
#include <vector>

namespace qinfer {

// Sets the console to UTF-8 on Windows (so Chinese text prints); no-op elsewhere.
void platform_init_console();
// argv as UTF-8 (Windows converts from the wide command line); pointers stay valid for the process.
std::vector<char*> platform_utf8_args(int argc, char** argv);
// Physical cores (not hyper-threads); at least 1.
int physical_cores();

}  // namespace qinfer
