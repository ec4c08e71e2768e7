// placeholder
#include "quant/cpu_kernels.h"
namespace qinfer::kernels {
const KernelTable* avx512_table() { return nullptr; }
}
