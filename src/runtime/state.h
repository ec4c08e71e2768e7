// Per-sequence state, keyed by slot: the KV cache of every attention layer and
// the conv + recurrent state of every DeltaNet layer, each allocated on the
// backend that runs its layer. Slot lengths live on the host.
//
// A slot snapshot (save_slot / restore_slot) is the building block of prompt
// caching: KV rows [0, len) plus the constant-size DeltaNet state at len.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace qinfer {

struct HParams;

struct StateConfig {
    int n_ctx = 4096;   // tokens per slot
    int n_slots = 1;
    GgmlType kv_type = GgmlType::F16;
};

class StateStore {
public:
    // layer_backend[i]: backend of main layer i (every layer needs one).
    StateStore(const HParams& hp, const StateConfig& cfg, const std::vector<Backend*>& layer_backend);
    ~StateStore();
    StateStore(const StateStore&) = delete;
    StateStore& operator=(const StateStore&) = delete;

    const StateConfig& config() const { return cfg_; }
    int n_slots() const { return cfg_.n_slots; }
    int n_ctx() const { return cfg_.n_ctx; }

    // Layer i's state; exactly one of these is set, by layer kind.
    const KvCache* kv(int layer) const { return kv_[size_t(layer)].k ? &kv_[size_t(layer)] : nullptr; }
    const RecurrentState* rs(int layer) const { return rs_[size_t(layer)].S ? &rs_[size_t(layer)] : nullptr; }

    int length(int slot) const { return len_[size_t(slot)]; }
    void set_length(int slot, int n) { len_[size_t(slot)] = n; }
    // Length 0 and zero recurrent state (KV rows need no clearing: they are
    // written before they are read).
    void clear(int slot);

    // A host copy of a slot (KV rows [0, length) and all recurrent state).
    struct Snapshot {
        int length = 0;
        std::vector<uint8_t> bytes;
    };
    Snapshot save(int slot) const;
    // Restores a snapshot into a slot (any slot: also clones sequences).
    void restore(int slot, const Snapshot& s);

    // Bytes allocated for state on all backends.
    uint64_t allocated_bytes() const { return allocated_; }

private:
    StateConfig cfg_;
    std::vector<KvCache> kv_;
    std::vector<RecurrentState> rs_;
    std::vector<int> len_;
    uint64_t allocated_ = 0;
};

}  // namespace qinfer
