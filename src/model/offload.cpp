#include "model/offload.h"

#include <algorithm>

#include "common/error.h"

namespace qinfer {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// At most this many segments per offloaded batch: the shadow state has one slot
// per segment (a prompt chunk plus a few decode tokens riding along).
constexpr int kMaxSegments = 4;

// KV shadow rows grow in steps of this many positions.
constexpr int64_t kKvRowStep = 1024;

// One slot's bytes of a state tensor whose outermost dimension is n slots.
size_t slot_bytes(const Tensor& t, int n) { return t.nbytes() / size_t(n); }

}  // namespace

PromptOffload::PromptOffload(Backend& target, const HParams& hp, const StateConfig& cfg, int n_batch, int min_batch,
                             const std::vector<LayerWeights>& layers, const std::vector<Backend*>& layer_backend)
    : target_(target),
      hp_(hp),
      cfg_(cfg),
      min_batch_(std::max(1, min_batch)),
      max_segments_(std::min(kMaxSegments, cfg.n_slots)),
      host_(layers) {
    // Arena size: the largest streamed layer, each tensor at an aligned offset.
    size_t arena_bytes = 0;
    streamed_.assign(layers.size(), false);
    for (size_t il = 0; il < layers.size(); ++il) {
        if (&target == layer_backend[il] || !layer_backend[il]->host_memory()) continue;
        streamed_[il] = true;
        (hp.is_recurrent(int(il)) ? any_rec_ : any_attn_) = true;
        size_t bytes = 0;
        for_each_tensor(layers[il], [&](const Tensor& t) { bytes += align_up(target.weight_bytes(t.type, t.ne)); });
        arena_bytes = std::max(arena_bytes, bytes);
    }
    if (arena_bytes == 0) return;
    // The streamed tensors' span of the mapped file, pinned if the target can.
    const uint8_t *lo = nullptr, *hi = nullptr;
    for (size_t il = 0; il < layers.size(); ++il) {
        if (!streamed_[il]) continue;
        for_each_tensor(layers[il], [&](const Tensor& t) {
            const uint8_t* p = static_cast<const uint8_t*>(t.data);
            if (!lo || p < lo) lo = p;
            if (!hi || p + t.nbytes() > hi) hi = p + t.nbytes();
        });
    }
    pinned_ = target.pin_streamed_range(lo, size_t(hi - lo));
    try {
        for (Tensor& a : arena_) a = target.alloc(GgmlType::I8, {int64_t(arena_bytes)}, "offload_weights");
        if (any_rec_) {
            rs_.conv = target.alloc(GgmlType::F32, {hp.ssm_conv_channels(), hp.ssm_conv_kernel - 1, max_segments_},
                                    "offload_conv_state");
            rs_.S = target.alloc(GgmlType::F32, {hp.ssm_state, hp.ssm_state, hp.ssm_v_heads, max_segments_},
                                 "offload_ssm_state");
        }
        step_.pos_t = target.alloc(GgmlType::I32, {n_batch}, "offload_pos");
        step_.slot_t = target.alloc(GgmlType::I32, {n_batch}, "offload_slot");
        step_.seg_t = target.alloc(GgmlType::I32, {4, n_batch}, "offload_segments");
    } catch (...) {
        release();
        throw;
    }
}

PromptOffload::~PromptOffload() { release(); }

void PromptOffload::release() {
    for (Tensor* t : {&arena_[0], &arena_[1], &kv_.k, &kv_.v, &rs_.conv, &rs_.S, &step_.pos_t, &step_.slot_t,
                      &step_.seg_t})
        if (*t) target_.free(*t);
}

void PromptOffload::ensure_kv_capacity(int64_t rows) {
    if (rows <= kv_rows_) return;
    const int64_t cap = std::min<int64_t>(cfg_.n_ctx, (rows + kKvRowStep - 1) / kKvRowStep * kKvRowStep);
    if (kv_.k) target_.free(kv_.k);
    if (kv_.v) target_.free(kv_.v);
    kv_rows_ = 0;
    kv_.k = target_.alloc(cfg_.kv_type, {hp_.head_dim, hp_.n_head_kv, cap, max_segments_}, "offload_cache_k");
    kv_.v = target_.alloc(cfg_.kv_type, {hp_.head_dim, hp_.n_head_kv, cap, max_segments_}, "offload_cache_v");
    kv_rows_ = cap;
}

bool PromptOffload::begin(const std::vector<int32_t>& pos, const std::vector<StepInfo::Segment>& segs) {
    const int T = int(pos.size());
    if (!arena_[0] || T < min_batch_ || int(segs.size()) > max_segments_) return false;
    if (any_attn_ && !target_.supports_kv_type(cfg_.kv_type)) return false;
    if (any_attn_) {
        int64_t rows = 0;
        for (const StepInfo::Segment& sg : segs) rows = std::max<int64_t>(rows, sg.pos0 + sg.count);
        try {
            ensure_kv_capacity(rows);
        } catch (const Error&) {
            // No room for this context on the GPU: these batches stay on the CPU.
            if (kv_.k) target_.free(kv_.k);
            if (kv_.v) target_.free(kv_.v);
            kv_rows_ = 0;
            return false;
        }
    }
    segs_ = segs;
    step_.n_tokens = T;
    step_.pos = pos;
    step_.slot.resize(size_t(T));
    step_.segments = segs;
    for (size_t i = 0; i < segs.size(); ++i) {
        step_.segments[i].slot = int32_t(i);
        for (int32_t t = segs[i].first; t < segs[i].first + segs[i].count; ++t) step_.slot[size_t(t)] = int32_t(i);
    }
    target_.write(step_.pos_t, step_.pos.data(), size_t(T) * 4);
    target_.write(step_.slot_t, step_.slot.data(), size_t(T) * 4);
    target_.write(step_.seg_t, step_.segments.data(), step_.segments.size() * sizeof(StepInfo::Segment));
    pending_layer_ = -1;
    arena_user_[0] = arena_user_[1] = -1;
    return true;
}

const LayerWeights& PromptOffload::stage(int il) {
    const int a = next_arena_;
    next_arena_ ^= 1;
    // stream_weight's contract: no earlier op may still read this arena. Its
    // last user is the streamed layer before the previous one, whose state
    // store_state has read back since (that read waited for its ops).
    if (pending_layer_ >= 0 && arena_user_[a] == pending_layer_)
        fail("prompt offload: staging into an arena whose layer is still running");
    arena_user_[a] = il;
    LayerWeights& w = staged_[a];
    w = host_[size_t(il)];
    size_t off = 0;
    for_each_tensor(w, [&](Tensor& t) {
        const Tensor host = t;
        t = target_.stream_weight(arena_[a], off, host.type, host.ne, host.data, host.name);
        off += align_up(target_.weight_bytes(host.type, host.ne));
    });
    return w;
}

PromptOffload::LayerState PromptOffload::load_state(int il, const StateStore& state) {
    LayerState ls;
    if (const KvCache* kv = state.kv(il)) {
        // Rows before the batch, per segment; the batch writes its own rows.
        for (size_t i = 0; i < segs_.size(); ++i) {
            const StepInfo::Segment& sg = segs_[i];
            if (sg.pos0 == 0) continue;
            const size_t bytes = size_t(sg.pos0) * kv->k.nb[2];
            for (const auto& [src, dst] : {std::pair{&kv->k, &kv_.k}, std::pair{&kv->v, &kv_.v}})
                target_.write(*dst, static_cast<const uint8_t*>(src->data) + size_t(sg.slot) * src->nb[3], bytes,
                              i * dst->nb[3]);
        }
        ls.kv = &kv_;
    } else if (const RecurrentState* rs = state.rs(il)) {
        for (size_t i = 0; i < segs_.size(); ++i) {
            const StepInfo::Segment& sg = segs_[i];
            for (const auto& [src, dst] : {std::pair{&rs->conv, &rs_.conv}, std::pair{&rs->S, &rs_.S}}) {
                const size_t n = slot_bytes(*dst, max_segments_);
                if (sg.pos0 == 0) {
                    // A slot of length 0 holds the zero state (StateStore::clear): no copy over the bus.
                    target_.fill_zero(view(*dst, {int64_t(n / 4)}, {}, i * n));
                } else {
                    target_.write(*dst, static_cast<const uint8_t*>(src->data) + size_t(sg.slot) * n, n, i * n);
                }
            }
        }
        ls.rs = &rs_;
    }
    pending_layer_ = il;
    return ls;
}

void PromptOffload::store_state(const StateStore& state) {
    if (pending_layer_ < 0) return;
    const int il = pending_layer_;
    pending_layer_ = -1;
    if (const KvCache* kv = state.kv(il)) {
        for (size_t i = 0; i < segs_.size(); ++i) {
            const StepInfo::Segment& sg = segs_[i];
            const size_t row = kv->k.nb[2];
            for (const auto& [src, dst] : {std::pair{&kv_.k, &kv->k}, std::pair{&kv_.v, &kv->v}})
                target_.read(*src, static_cast<uint8_t*>(dst->data) + size_t(sg.slot) * dst->nb[3] + size_t(sg.pos0) * row,
                             size_t(sg.count) * row, i * src->nb[3] + size_t(sg.pos0) * row);
        }
    } else if (const RecurrentState* rs = state.rs(il)) {
        for (size_t i = 0; i < segs_.size(); ++i) {
            const StepInfo::Segment& sg = segs_[i];
            for (const auto& [src, dst] : {std::pair{&rs_.conv, &rs->conv}, std::pair{&rs_.S, &rs->S}}) {
                const size_t n = slot_bytes(*src, max_segments_);
                target_.read(*src, static_cast<uint8_t*>(dst->data) + size_t(sg.slot) * n, n, i * n);
            }
        }
    }
}

}  // namespace qinfer
