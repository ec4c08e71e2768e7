#include "runtime/state.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "model/hparams.h"

namespace qinfer {

StateStore::StateStore(const HParams& hp, const StateConfig& cfg, const std::vector<Backend*>& layer_backend)
    : cfg_(cfg) {
    if (cfg.n_ctx <= 0 || cfg.n_slots <= 0) fail("state: n_ctx and n_slots must be positive");
    if (cfg.kv_type != GgmlType::F16 && cfg.kv_type != GgmlType::F32 && cfg.kv_type != GgmlType::Q8_0)
        fail(strfmt("state: KV cache type %s is not supported (f16, f32 or q8_0)", type_name(cfg.kv_type)));
    if (cfg.kv_type == GgmlType::Q8_0 && hp.head_dim % traits(GgmlType::Q8_0).block_size != 0)
        fail(strfmt("state: a q8_0 KV cache needs a head dim that is a multiple of 32 (this model: %lld)",
                    (long long)hp.head_dim));
    kv_.resize(size_t(hp.n_layer));
    rs_.resize(size_t(hp.n_layer));
    len_.assign(size_t(cfg.n_slots), 0);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        Backend* be = layer_backend[size_t(il)];
        if (hp.is_recurrent(il)) {
            RecurrentState& r = rs_[size_t(il)];
            r.conv = be->alloc(GgmlType::F32, {hp.ssm_conv_channels(), hp.ssm_conv_kernel - 1, cfg.n_slots}, "conv_state");
            r.S = be->alloc(GgmlType::F32, {hp.ssm_state, hp.ssm_state, hp.ssm_v_heads, cfg.n_slots}, "ssm_state");
            allocated_ += r.conv.nbytes() + r.S.nbytes();
        } else {
            if (!be->supports_kv_type(cfg.kv_type))
                fail(strfmt("state: KV cache type %s is not supported on %s yet (layer %lld); use an f16 cache "
                            "or keep the attention layers on the CPU",
                            type_name(cfg.kv_type), be->name().c_str(), (long long)il));
            KvCache& c = kv_[size_t(il)];
            c.k = be->alloc(cfg.kv_type, {hp.head_dim, hp.n_head_kv, cfg.n_ctx, cfg.n_slots}, "cache_k");
            c.v = be->alloc(cfg.kv_type, {hp.head_dim, hp.n_head_kv, cfg.n_ctx, cfg.n_slots}, "cache_v");
            allocated_ += c.k.nbytes() + c.v.nbytes();
        }
    }
}

StateStore::~StateStore() {
    for (KvCache& c : kv_) {
        if (c.k) c.k.backend->free(c.k);
        if (c.v) c.v.backend->free(c.v);
    }
    for (RecurrentState& r : rs_) {
        if (r.conv) r.conv.backend->free(r.conv);
        if (r.S) r.S.backend->free(r.S);
    }
}

void StateStore::clear(int slot) {
    if (slot < 0 || slot >= cfg_.n_slots) fail(strfmt("state: slot %d out of range (0..%d)", slot, cfg_.n_slots - 1));
    len_[size_t(slot)] = 0;
    for (const RecurrentState& r : rs_) {
        if (!r.S) continue;
        // One slot is the outermost index: a contiguous range of each tensor.
        r.conv.backend->fill_zero(view(r.conv, {r.conv.ne[0], r.conv.ne[1]}, {}, size_t(slot) * r.conv.nb[2]));
        r.S.backend->fill_zero(view(r.S, {r.S.ne[0], r.S.ne[1], r.S.ne[2]}, {}, size_t(slot) * r.S.nb[3]));
    }
}

// Snapshot layout: for each layer in order, KV: K rows then V rows [first, length);
// recurrent: conv state then S of the slot.
uint64_t StateStore::snapshot_bytes(int first, int length) const {
    uint64_t total = 0;
    for (size_t il = 0; il < kv_.size(); ++il) {
        if (kv_[il].k) total += 2 * uint64_t(length - first) * kv_[il].k.nb[2];
        if (rs_[il].S) total += rs_[il].conv.nb[2] + rs_[il].S.nb[3];
    }
    return total;
}

std::shared_ptr<const StateStore::Snapshot> StateStore::save(int slot, std::shared_ptr<const Snapshot> base) const {
    if (slot < 0 || slot >= cfg_.n_slots) fail(strfmt("state: slot %d out of range", slot));
    auto s = std::make_shared<Snapshot>();
    s->length = len_[size_t(slot)];
    if (base && base->length > 0 && base->length <= s->length) {
        s->first = base->length;
        s->base = std::move(base);
    }
    s->bytes.resize(snapshot_bytes(s->first, s->length));
    uint8_t* p = s->bytes.data();
    auto get = [&](const Tensor& t, size_t offset, size_t n) {
        if (n) t.backend->read(t, p, n, offset);
        p += n;
    };
    const size_t rows = size_t(s->length - s->first);
    for (size_t il = 0; il < kv_.size(); ++il) {
        if (const Tensor& k = kv_[il].k; k) {
            const size_t at = size_t(slot) * k.nb[3] + size_t(s->first) * k.nb[2];
            get(k, at, rows * k.nb[2]);
            get(kv_[il].v, at, rows * k.nb[2]);
        }
        if (const RecurrentState& r = rs_[il]; r.S) {
            get(r.conv, size_t(slot) * r.conv.nb[2], r.conv.nb[2]);
            get(r.S, size_t(slot) * r.S.nb[3], r.S.nb[3]);
        }
    }
    return s;
}

void StateStore::restore(int slot, const Snapshot& s, int keep) {
    if (slot < 0 || slot >= cfg_.n_slots) fail(strfmt("state: slot %d out of range", slot));
    if (s.length < 0 || s.length > cfg_.n_ctx)
        fail(strfmt("state: snapshot of %d tokens does not fit a context of %d", s.length, cfg_.n_ctx));
    keep = std::clamp(keep, 0, s.length);
    // Every piece of the chain first: a mismatch leaves the slot untouched.
    for (const Snapshot* seg = &s; seg; seg = seg->base.get()) {
        if (seg->bytes.size() != snapshot_bytes(seg->first, seg->length) || (seg->first > 0) != bool(seg->base) ||
            (seg->base && seg->base->length != seg->first))
            fail("state: snapshot does not match this model's state layout");
    }
    // KV rows [max(first, keep), length) of each piece, newest piece first;
    // the recurrent state from the newest only.
    for (const Snapshot* seg = &s; seg; seg = seg->base.get()) {
        if (seg != &s && seg->length <= keep) break;  // older pieces hold only kept rows
        const size_t own = size_t(seg->length - seg->first);
        const size_t lo = std::min(own, size_t(std::max(seg->first, keep) - seg->first));
        const uint8_t* p = seg->bytes.data();
        for (size_t il = 0; il < kv_.size(); ++il) {
            if (const Tensor& k = kv_[il].k; k) {
                const size_t rb = k.nb[2], at = size_t(slot) * k.nb[3] + (size_t(seg->first) + lo) * rb;
                const size_t n = (own - lo) * rb;
                if (n) {
                    k.backend->write(k, p + lo * rb, n, at);
                    kv_[il].v.backend->write(kv_[il].v, p + own * rb + lo * rb, n, at);
                }
                p += 2 * own * rb;
            }
            if (const RecurrentState& r = rs_[il]; r.S) {
                if (seg == &s) {
                    r.conv.backend->write(r.conv, p, r.conv.nb[2], size_t(slot) * r.conv.nb[2]);
                    r.S.backend->write(r.S, p + r.conv.nb[2], r.S.nb[3], size_t(slot) * r.S.nb[3]);
                }
                p += r.conv.nb[2] + r.S.nb[3];
            }
        }
    }
    for (size_t il = 0; il < kv_.size(); ++il) {
        Backend* be = kv_[il].k ? kv_[il].k.backend : rs_[il].S ? rs_[il].S.backend : nullptr;
        if (be) be->synchronize();  // the snapshot's bytes may be freed right after
    }
    len_[size_t(slot)] = s.length;
}

}  // namespace qinfer
