// Each subcommand of the `qinfer` binary lives in its own cmd_<name>.cpp.
// argv[0] is the subcommand name; return value is the process exit code.
#pragma once

namespace qinfer::cli {

int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_convert(int argc, char** argv);

}  // namespace qinfer::cli
