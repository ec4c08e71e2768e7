// Internal state of qinfer::Tokenizer, shared by its .cpp files.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace qinfer {

// Token attributes as llama.cpp keeps them: a bit set, because its load-time
// fix-ups add bits (a NORMAL "</s>" becomes NORMAL|CONTROL).
enum : uint8_t {
    kAttrNormal = 1,
    kAttrUnknown = 2,
    kAttrControl = 4,
    kAttrUserDefined = 8,
    kAttrUnused = 16,
    kAttrByte = 32,
};

// Cache of piece bytes -> ids. Pieces repeat a lot (words, CJK phrases,
// indentation), so most pieces skip BPE. Direct-mapped slots (a colliding
// piece replaces the old one) split into shards with one mutex each, so many
// threads can encode at once; memory is fixed.
class PieceCache {
public:
    static constexpr size_t kMaxKey = 30;  // bytes
    static constexpr size_t kMaxIds = 14;
    PieceCache();
    // On a hit appends the ids to `out` and returns true.
    bool get(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const;
    void put(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n) const;

private:
    struct Slot {
        uint8_t key_len = 0xFF;  // 0xFF: empty
        uint8_t n_ids = 0;
        char key[kMaxKey];
        int32_t ids[kMaxIds];
    };
    static constexpr size_t kShards = 64;
    static constexpr size_t kSlotsPerShard = 512;
    struct Shard {
        std::mutex mu;
        Slot slots[kSlotsPerShard];
    };
    std::unique_ptr<Shard[]> shards_;
};

struct Tokenizer::Impl {
    PreTokenizer pre = PreTokenizer::Qwen2;
    std::string pre_name;
    TokenizerOptions opts;
    std::string path;  // for messages

    int32_t n_vocab = 0;
    std::string text_arena;            // raw token texts back to back
    std::vector<uint32_t> text_off;    // n_vocab + 1 offsets
    std::string render_arena;          // what each token prints as (show_special = true)
    std::vector<uint32_t> render_off;  // n_vocab + 1 offsets
    std::vector<uint8_t> attr;         // kAttr* bits
    TextIndex index;                   // raw text -> id (last id wins)

    // BPE symbols whose text is not a vocabulary entry (never in Qwen files):
    // ids n_vocab + k.
    std::vector<std::string> virtual_text;
    std::unordered_map<std::string, int32_t> virtual_index;
    BpeMerges merges;
    int32_t n_merges = 0;

    // Tokens matched in raw text before pre-tokenization, longest first.
    std::vector<int32_t> specials;
    std::string special_first_bytes;  // distinct first bytes of `specials`

    int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, pad = kNoToken;
    int32_t unk = kNoToken, sep = kNoToken, mask = kNoToken;
    int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;
    int32_t fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
    bool add_bos = false, add_eos = false;
    std::vector<int32_t> eog;  // sorted

    std::vector<std::string> warnings;
    PieceCache cache;

    std::string_view text(int32_t id) const {
        return std::string_view(text_arena).substr(text_off[size_t(id)], text_off[size_t(id) + 1] - text_off[size_t(id)]);
    }
    std::string_view rendered(int32_t id) const {
        return std::string_view(render_arena)
            .substr(render_off[size_t(id)], render_off[size_t(id) + 1] - render_off[size_t(id)]);
    }
    int32_t lookup(std::string_view t) const {
        return index.get(t, [this](int32_t id) { return text(id); });
    }
    void check_id(int32_t id) const;
    // lookup() of n texts at once (n <= kLookupBatch), overlapping cache misses.
    static constexpr size_t kLookupBatch = 192;
    void lookup_batch(const std::string_view* texts, size_t n, int32_t* ids) const;

    void load(const gguf::File& f);
    void encode_fragment(std::string_view frag, std::vector<int32_t>& out) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void emit_symbols(const int32_t* syms, size_t n, std::vector<int32_t>& out) const;
};

}  // namespace qinfer
