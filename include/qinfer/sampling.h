// Sampling parameters of one generation request (llama.cpp semantics).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace qinfer {

struct SamplingParams {
    // temperature <= 0 means greedy (argmax after penalties and bias).
    float temperature = 0.8f;
    int top_k = 40;                  // <= 0: disabled
    float top_p = 0.95f;             // >= 1: disabled
    float min_p = 0.05f;             // <= 0: disabled
    float repeat_penalty = 1.0f;     // 1: disabled; > 1 divides positive logits, multiplies negative
    int repeat_last_n = 64;          // tokens considered by the penalties; 0 = none, -1 = whole context
    float presence_penalty = 0.0f;   // subtracted once from every token seen in the window
    float frequency_penalty = 0.0f;  // subtracted per occurrence in the window
    int64_t seed = -1;               // < 0: a random seed (see Sampler::seed())
    int min_keep = 1;                // top-k/top-p/min-p never keep fewer candidates than this
    // Added to the raw logit of a token before anything else; -INFINITY bans it.
    std::vector<std::pair<int32_t, float>> logit_bias;
};

}  // namespace qinfer
