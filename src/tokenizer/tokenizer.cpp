// Encoding, decoding and queries of qinfer::Tokenizer; loading is in vocab_load.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace qinfer {

// ---------------------------------------------------------------- PieceCache

PieceCache::PieceCache() : shards_(new Shard[kShards]) {}

bool PieceCache::get(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const {
    Shard& sh = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    const Slot& s = sh.slots[(hash / kShards) % kSlotsPerShard];
    if (s.key_len != piece.size() || std::memcmp(s.key, piece.data(), piece.size()) != 0) return false;
    out.insert(out.end(), s.ids, s.ids + s.n_ids);
    return true;
}

void PieceCache::put(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n) const {
    if (piece.size() > kMaxKey || n > kMaxIds) return;
    Shard& sh = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    Slot& s = sh.slots[(hash / kShards) % kSlotsPerShard];
    s.key_len = uint8_t(piece.size());
    s.n_ids = uint8_t(n);
    std::memcpy(s.key, piece.data(), piece.size());
    std::memcpy(s.ids, ids, n * sizeof(int32_t));
}

// ---------------------------------------------------------------- encoding

void Tokenizer::Impl::check_id(int32_t id) const {
    if (id < 0 || id >= n_vocab) fail(strfmt("tokenizer: token id %d out of range [0, %d)", id, n_vocab));
}

void Tokenizer::Impl::emit_symbols(const int32_t* syms, size_t n, std::vector<int32_t>& out) const {
    for (size_t i = 0; i < n; ++i) {
        if (syms[i] < n_vocab) {
            out.push_back(syms[i]);
            continue;
        }
        // A symbol that is not a token (broken vocabulary): llama.cpp emits the
        // tokens of its single bytes that happen to exist.
        for (char c : virtual_text[size_t(syms[i] - n_vocab)]) {
            int32_t id = lookup(std::string_view(&c, 1));
            if (id >= 0) out.push_back(id);
        }
    }
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    const bool cacheable = piece.size() > 1 && piece.size() <= PieceCache::kMaxKey;
    uint64_t h = 0;
    if (cacheable) {
        h = TextIndex::hash(piece);
        if (cache.get(piece, h, out)) return;
    }
    thread_local std::vector<int32_t> syms;
    syms.clear();
    merges.apply(reinterpret_cast<const unsigned char*>(piece.data()), piece.size(), syms);
    const size_t before = out.size();
    emit_symbols(syms.data(), syms.size(), out);
    if (cacheable) cache.put(piece, h, out.data() + before, out.size() - before);
    if (syms.capacity() > (1u << 16)) std::vector<int32_t>().swap(syms);
}

void Tokenizer::Impl::encode_fragment(std::string_view frag, std::vector<int32_t>& out) const {
    if (frag.empty()) return;
    std::string normalized;
    // Invalid UTF-8 is not normalized: such a fragment stays as it is.
    if (opts.nfc && unicode::to_nfc(frag, normalized)) frag = normalized;
    std::vector<size_t> ends;
    ends.reserve(frag.size() / 4 + 4);
    pretokenize(pre, frag, ends);
    size_t begin = 0;
    for (size_t end : ends) {
        encode_piece(frag.substr(begin, end - begin), out);
        begin = end;
    }
}

Tokenizer::Tokenizer(const gguf::File& file, const TokenizerOptions& opts) : impl_(std::make_unique<Impl>()) {
    impl_->opts = opts;
    impl_->load(file);
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    const Impl& m = *impl_;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);

    // Special tokens first (llama.cpp tokenizer_st_partition): each candidate,
    // longest first, splits every remaining text fragment at its occurrences.
    bool maybe_special = false;
    for (char c : m.special_first_bytes)
        if (text.find(c) != std::string_view::npos) maybe_special = true;
    if (!maybe_special) {
        m.encode_fragment(text, out);
        return out;
    }
    struct Frag {
        size_t begin, end;
        int32_t id;  // >= 0: a special token; -1: text [begin, end)
    };
    std::vector<Frag> frags{{0, text.size(), -1}}, next;
    for (int32_t id : m.specials) {
        if (!parse_special && (m.attr[size_t(id)] & (kAttrControl | kAttrUnknown))) continue;
        const std::string_view t = m.text(id);
        bool hit = false;
        next.clear();
        for (const Frag& f : frags) {
            if (f.id >= 0 || f.end - f.begin < t.size()) {
                next.push_back(f);
                continue;
            }
            const std::string_view hay = text.substr(0, f.end);
            size_t pos = f.begin;
            for (size_t at; (at = hay.find(t, pos)) != std::string_view::npos; pos = at + t.size()) {
                if (at > pos) next.push_back({pos, at, -1});
                next.push_back({at, at + t.size(), id});
                hit = true;
            }
            if (pos < f.end) next.push_back({pos, f.end, -1});
        }
        if (hit) frags.swap(next);
    }
    for (const Frag& f : frags) {
        if (f.id >= 0)
            out.push_back(f.id);
        else
            m.encode_fragment(text.substr(f.begin, f.end - f.begin), out);
    }
    return out;
}

// ---------------------------------------------------------------- decoding and queries

std::string_view Tokenizer::piece(int32_t id, bool show_special) const {
    impl_->check_id(id);
    if (!show_special && (impl_->attr[size_t(id)] & (kAttrControl | kAttrUnknown))) return {};
    return impl_->rendered(id);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool show_special) const {
    std::string out;
    for (int32_t id : ids) out += piece(id, show_special);
    return out;
}

std::string_view Tokenizer::token_text(int32_t id) const {
    impl_->check_id(id);
    return impl_->text(id);
}

std::string Tokenizer::token_bytes(int32_t id) const {
    impl_->check_id(id);
    return std::string(impl_->rendered(id));
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab; }
int32_t Tokenizer::n_merges() const { return impl_->n_merges; }
PreTokenizer Tokenizer::pre_tokenizer() const { return impl_->pre; }
std::string_view Tokenizer::pre_tokenizer_name() const { return impl_->pre_name; }

int32_t Tokenizer::find_token(std::string_view text) const {
    int32_t id = impl_->lookup(text);
    return id >= 0 ? id : kNoToken;
}

TokenType Tokenizer::token_type(int32_t id) const {
    impl_->check_id(id);
    const uint8_t a = impl_->attr[size_t(id)];
    if (a & kAttrControl) return TokenType::Control;
    if (a & kAttrUserDefined) return TokenType::UserDefined;
    if (a & kAttrUnknown) return TokenType::Unknown;
    if (a & kAttrUnused) return TokenType::Unused;
    if (a & kAttrByte) return TokenType::Byte;
    if (a & kAttrNormal) return TokenType::Normal;
    return TokenType::Undefined;
}

static bool has_attr(const Tokenizer::Impl& m, int32_t id, uint8_t bits) {
    return id >= 0 && id < m.n_vocab && (m.attr[size_t(id)] & bits);
}
bool Tokenizer::is_control(int32_t id) const { return has_attr(*impl_, id, kAttrControl); }
bool Tokenizer::is_user_defined(int32_t id) const { return has_attr(*impl_, id, kAttrUserDefined); }
bool Tokenizer::is_unused(int32_t id) const { return has_attr(*impl_, id, kAttrUnused); }
bool Tokenizer::is_special(int32_t id) const {
    return has_attr(*impl_, id, kAttrControl | kAttrUserDefined | kAttrUnknown);
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::eot_id() const { return impl_->eot; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id); }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }
const std::vector<std::string>& Tokenizer::warnings() const { return impl_->warnings; }

// ---------------------------------------------------------------- UTF-8 helpers, streaming

namespace {

// Expected length of the sequence led by byte c: 1..4, or 0 if c cannot lead.
int seq_len(unsigned c) {
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    if (c < 0xF5) return 4;
    return 0;
}

bool second_ok(unsigned lead, unsigned c1) {
    if ((c1 & 0xC0) != 0x80) return false;
    if (lead == 0xE0) return c1 >= 0xA0;  // no overlong forms
    if (lead == 0xED) return c1 <= 0x9F;  // no surrogates
    if (lead == 0xF0) return c1 >= 0x90;
    if (lead == 0xF4) return c1 <= 0x8F;  // <= U+10FFFF
    return true;
}

// Bytes from i that form a valid (possibly unfinished) sequence; at least 1.
size_t valid_run(const unsigned char* s, size_t n, size_t i) {
    const int need = seq_len(s[i]);
    if (need <= 1) return 1;
    size_t k = 1;
    if (i + 1 < n && second_ok(s[i], s[i + 1])) {
        k = 2;
        while (k < size_t(need) && i + k < n && (s[i + k] & 0xC0) == 0x80) ++k;
    }
    return k;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view sv) {
    const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
    const size_t n = sv.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const size_t i = n - back;
        if ((s[i] & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
        const int need = seq_len(s[i]);
        if (need > int(back) && valid_run(s, n, i) == back) return i;  // unfinished: hold back
        return n;
    }
    return n;
}

std::string utf8_sanitize(std::string_view sv) {
    const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
    const size_t n = sv.size();
    std::string out;
    out.reserve(n);
    for (size_t i = 0; i < n;) {
        unicode::Decoded d = unicode::decode_utf8(s, n, i);
        if (d.cp != unicode::kInvalidByte) {
            out.append(sv.data() + i, d.len);
            i += d.len;
        } else {
            out += "\xEF\xBF\xBD";
            i += valid_run(s, n, i);  // one U+FFFD per maximal invalid subpart
        }
    }
    return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool show_special) : tok_(&tok), show_special_(show_special) {}

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_->piece(id, show_special_);
    const size_t k = utf8_complete_prefix(pending_);
    std::string out = utf8_sanitize(std::string_view(pending_).substr(0, k));
    pending_.erase(0, k);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out = utf8_sanitize(pending_);
    pending_.clear();
    return out;
}

}  // namespace qinfer
