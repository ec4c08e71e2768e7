// Per-sequence state, keyed by slot: the KV cache of every attention layer and
// the conv + recurrent state of every DeltaNet layer, each allocated on the
// backend that runs its layer. Slot lengths live on the host.
//
// A slot snapshot (save_slot / restore_slot) is the building block of prompt
// caching: KV rows [0, len) plus the constant-size DeltaNet state at len.
#pragma once
#include <cstdint>
#include <memory>
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

    // A host copy of a slot: KV rows [0, length) and the recurrent state at
    // `length`. A snapshot taken on top of an earlier one of the same history
    // holds only the rows it adds ([first, length), first = base->length) and
    // shares the rest through `base`: the second turn of a long conversation
    // copies its new rows, not the whole history again.
    struct Snapshot {
        int length = 0;
        int first = 0;                            // rows [0, first) live in base
        std::shared_ptr<const Snapshot> base;     // set when first > 0
        std::vector<uint8_t> bytes;               // KV rows [first, length) of every layer, then the recurrent state
        uint64_t own_bytes() const { return bytes.size(); }
    };
    // `base`, when given, must be a snapshot of a prefix of this slot's
    // current history (its rows are still the slot's rows [0, base->length)).
    std::shared_ptr<const Snapshot> save(int slot, std::shared_ptr<const Snapshot> base = nullptr) const;
    // Restores a snapshot into a slot (any slot: also clones sequences). Rows
    // [0, keep) are left as they are: the caller knows the slot already holds
    // them (its own history shares that prefix with the snapshot).
    void restore(int slot, const Snapshot& s, int keep = 0);

    // Bytes allocated for state on all backends.
    uint64_t allocated_bytes() const { return allocated_; }

private:
    uint64_t snapshot_bytes(int first, int length) const;  // of one piece (rows [first, length))
    StateConfig cfg_;
    std::vector<KvCache> kv_;
    std::vector<RecurrentState> rs_;
    std::vector<int> len_;
    uint64_t allocated_ = 0;
};

}  // namespace qinfer
