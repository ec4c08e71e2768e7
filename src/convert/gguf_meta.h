// Architecture metadata keys (spec/models.md §7) from hyperparameters; used by
// both the HF converter and the random-model generator so the two can never
// disagree on what a qwen35/qwen3/qwen2 file must declare.
#pragma once
#include <cstdint>

#include "convert/hf_config.h"
#include "quant/types.h"

namespace qinfer::gguf { class Writer; }

namespace qinfer::convert {

// general.* and {arch}.* keys. `file_type` is the llama_ftype (gguf.md §11.1).
void write_hparams(gguf::Writer& w, const HfConfig& c, uint32_t file_type);

// llama_ftype for a file whose 2-D weights are all of type t ("mostly t").
uint32_t file_type_of(GgmlType t);

}  // namespace qinfer::convert
