// Tokenizer construction from GGUF metadata (spec/tokenizer.md §1, §2, §5),
// including llama.cpp's load-time fix-ups, which decide which tokens are
// matched as special text and which ones end generation.
#include <algorithm>
#include <cstring>
#include <span>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace qinfer {
namespace {

constexpr const char* kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                     "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>"};
constexpr const char* kEomTexts[] = {"<|eom_id|>"};
constexpr const char* kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "<|code_prefix|>",
                                        "<|prefix|>"};
constexpr const char* kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "<|code_suffix|>",
                                        "<|suffix|>"};
constexpr const char* kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "<|code_middle|>",
                                        "<|middle|>"};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>"};
// Texts that end generation wherever they appear in a vocabulary (llama.cpp's list).
constexpr const char* kEogTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                     "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                     "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                     "<turn|>", "<|tool_response>"};

uint8_t attr_from_type(int64_t t) {
    switch (t) {
        case 1: return kAttrNormal;
        case 2: return kAttrUnknown;
        case 3: return kAttrControl;
        case 4: return kAttrUserDefined;
        case 5: return kAttrUnused;
        case 6: return kAttrByte;
        default: return 0;  // undefined
    }
}

// "<0x0A>" -> 10 (SentencePiece byte tokens), -1 otherwise.
int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

void Tokenizer::Impl::lookup_batch(const std::string_view* q, size_t n, int32_t* ids) const {
    uint64_t h[kLookupBatch];
    for (size_t i = 0; i < n; ++i) {
        h[i] = TextIndex::hash(q[i]);
        index.prefetch(h[i]);
    }
    for (size_t i = 0; i < n; ++i)
        if (int32_t c = index.candidate(h[i]); c >= 0) QINFER_PREFETCH(&text_off[size_t(c)]);
    for (size_t i = 0; i < n; ++i)
        if (int32_t c = index.candidate(h[i]); c >= 0) QINFER_PREFETCH(text_arena.data() + text_off[size_t(c)]);
    for (size_t i = 0; i < n; ++i) ids[i] = index.get_hashed(h[i], q[i], [this](int32_t id) { return text(id); });
}

void Tokenizer::Impl::load(const gguf::File& f) {
    path = f.path();
    auto err = [&](const std::string& msg) { fail("tokenizer: " + path + ": " + msg); };

    // ---- model and pre-tokenizer
    auto model = f.get_string("tokenizer.ggml.model");
    if (!model) err("missing tokenizer.ggml.model (not a model file with a vocabulary?)");
    if (*model != "gpt2")
        err("unsupported tokenizer model '" + std::string(*model) + "' (supported: gpt2 byte-level BPE)");
    auto pre_v = f.get_string("tokenizer.ggml.pre");
    if (!pre_v) err("missing tokenizer.ggml.pre; the pre-tokenizer cannot be chosen (expected qwen2 or qwen35)");
    pre_name = std::string(*pre_v);
    if (pre_name == "qwen2" || pre_name == "deepseek-r1-qwen")
        pre = PreTokenizer::Qwen2;
    else if (pre_name == "qwen35")
        pre = PreTokenizer::Qwen35;
    else
        err("unknown pre-tokenizer '" + pre_name + "' (supported: qwen2, qwen35)");

    // ---- tokens
    const std::vector<std::string_view>* tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (!tokens) err("missing tokenizer.ggml.tokens");
    if (tokens->empty()) err("tokenizer.ggml.tokens is empty");
    if (tokens->size() > size_t(INT32_MAX / 2)) err(strfmt("too many tokens (%zu)", tokens->size()));
    n_vocab = int32_t(tokens->size());

    size_t total = 0;
    for (size_t i = 0; i < tokens->size(); ++i)
        total += (*tokens)[i].empty() ? 32 : (*tokens)[i].size();
    if (total >= UINT32_MAX) err("token texts exceed 4 GiB");
    text_arena.reserve(total);
    text_off.resize(size_t(n_vocab) + 1);
    for (int32_t id = 0; id < n_vocab; ++id) {
        text_off[size_t(id)] = uint32_t(text_arena.size());
        std::string_view t = (*tokens)[size_t(id)];
        if (t.empty()) {
            warnings.push_back(strfmt("empty token at index %d", id));
            text_arena += "[EMPTY_" + std::to_string(id) + "]";
        } else {
            text_arena.append(t.data(), t.size());
        }
    }
    text_off[size_t(n_vocab)] = uint32_t(text_arena.size());
    index.reserve(size_t(n_vocab));
    size_t duplicates = 0;
    {
        std::vector<uint64_t> hashes(static_cast<size_t>(n_vocab));
        for (int32_t id = 0; id < n_vocab; ++id) hashes[size_t(id)] = TextIndex::hash(text(id));
        constexpr int32_t kAhead = 16;
        for (int32_t id = 0; id < n_vocab; ++id) {
            if (id + kAhead < n_vocab) index.prefetch(hashes[size_t(id + kAhead)]);
            if (!index.put_hashed(hashes[size_t(id)], text(id), id, [this](int32_t i) { return text(i); }))
                ++duplicates;
        }
    }

    if (duplicates) warnings.push_back(strfmt("%zu token texts occur more than once (the last id is used)", duplicates));

    // ---- token types
    attr.assign(size_t(n_vocab), kAttrNormal);
    if (const gguf::Value* tt = f.find("tokenizer.ggml.token_type")) {
        if (!tt->is_array() || !(tt->elem_type == gguf::ValueType::I32 || tt->elem_type == gguf::ValueType::U32 ||
                                 tt->elem_type == gguf::ValueType::I8 || tt->elem_type == gguf::ValueType::U8 ||
                                 tt->elem_type == gguf::ValueType::I16 || tt->elem_type == gguf::ValueType::U16 ||
                                 tt->elem_type == gguf::ValueType::I64 || tt->elem_type == gguf::ValueType::U64))
            err("tokenizer.ggml.token_type is not an integer array");
        if (tt->count < uint64_t(n_vocab))
            err(strfmt("tokenizer.ggml.token_type has %llu entries for %d tokens", (unsigned long long)tt->count, n_vocab));
        if (tt->elem_type == gguf::ValueType::I32) {
            for (int32_t id = 0; id < n_vocab; ++id) {
                int32_t v;
                std::memcpy(&v, tt->elems + size_t(id) * 4, 4);
                attr[size_t(id)] = attr_from_type(v);
            }
        } else {
            for (int32_t id = 0; id < n_vocab; ++id) attr[size_t(id)] = attr_from_type(tt->int_at(uint64_t(id)));
        }
    }

    // ---- BPE symbols of single bytes, then merges
    int32_t byte_sym[256];
    auto symbol_of = [&](std::string_view t) -> int32_t {
        int32_t id = lookup(t);
        if (id >= 0) return id;
        auto it = virtual_index.find(std::string(t));
        return it == virtual_index.end() ? -1 : it->second;
    };
    auto make_symbol = [&](std::string_view t) -> int32_t {
        int32_t id = symbol_of(t);
        if (id >= 0) return id;
        id = n_vocab + int32_t(virtual_text.size());
        virtual_text.emplace_back(t);
        virtual_index.emplace(std::string(t), id);
        return id;
    };
    for (int b = 0; b < 256; ++b) {
        std::string t;
        unicode::append_utf8(t, unicode::byte_to_cp(uint8_t(b)));
        byte_sym[b] = make_symbol(t);
    }
    const std::vector<std::string_view>* mv = f.get_string_array("tokenizer.ggml.merges");
    if (!mv) err("missing tokenizer.ggml.merges");
    if (mv->size() > size_t(INT32_MAX)) err("too many merges");
    n_merges = int32_t(mv->size());
    // Resolve every merge's parts and result in the vocabulary, in batches.
    // Then the rare texts that are not tokens become virtual symbols: every
    // merge result first (a part may be the result of a later merge), then the
    // parts; a part that is neither a byte nor a merge result can never be
    // formed, so such a merge can never apply.
    const size_t nm = mv->size();
    std::vector<int32_t> mleft(nm, -1), mright(nm, -1), mresult(nm, -1);
    std::vector<uint32_t> msplit(nm, 0);  // position of the separating space; 0 = malformed
    {
        // Converted vocabularies usually list merge results in rank order
        // (Qwen: result of merge r = id 256 + r), so the result id is first
        // guessed from the previous merge and verified against the text; only
        // a wrong guess costs a hash lookup.
        // With duplicate token texts the guess could name an id that is not
        // the one lookup() returns (the last), so then every result is looked up.
        int64_t offset = -1;  // result id - rank of the last resolved merge; -1 = unknown
        auto guess_ok = [&](size_t r, std::string_view m, size_t sp) {
            if (duplicates || offset < 0 || int64_t(r) + offset >= n_vocab) return false;
            std::string_view t = text(int32_t(int64_t(r) + offset));
            return t.size() == m.size() - 1 && t.substr(0, sp) == m.substr(0, sp) && t.substr(sp) == m.substr(sp + 1);
        };
        std::string cat;
        std::string_view q[Impl::kLookupBatch];
        int32_t ids[Impl::kLookupBatch];
        constexpr size_t per = Impl::kLookupBatch / 3;
        for (size_t b0 = 0; b0 < nm; b0 += per) {
            const size_t b1 = std::min(nm, b0 + per);
            cat.clear();
            for (size_t r = b0; r < b1; ++r) {
                std::string_view m = (*mv)[r];
                size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
                if (sp == std::string_view::npos || sp + 1 >= m.size() || sp > UINT32_MAX) continue;
                msplit[r] = uint32_t(sp);
                if (guess_ok(r, m, sp)) {
                    mresult[r] = int32_t(int64_t(r) + offset);
                    continue;
                }
                cat.append(m.data(), sp);
                cat.append(m.data() + sp + 1, m.size() - sp - 1);
            }
            size_t nq = 0, at = 0;
            for (size_t r = b0; r < b1; ++r) {
                if (!msplit[r]) continue;
                std::string_view m = (*mv)[r];
                const size_t sp = msplit[r];
                q[nq++] = m.substr(0, sp);
                q[nq++] = m.substr(sp + 1);
                if (mresult[r] < 0) {
                    q[nq++] = std::string_view(cat).substr(at, m.size() - 1);
                    at += m.size() - 1;
                }
            }
            lookup_batch(q, nq, ids);
            nq = 0;
            for (size_t r = b0; r < b1; ++r) {
                if (!msplit[r]) continue;
                mleft[r] = ids[nq++];
                mright[r] = ids[nq++];
                if (mresult[r] < 0) mresult[r] = ids[nq++];
                if (mresult[r] >= 0) offset = int64_t(mresult[r]) - int64_t(r);
            }
        }
    }
    std::string cat;
    for (size_t r = 0; r < nm; ++r) {
        if (!msplit[r]) {
            warnings.push_back(strfmt("merge #%zu has no ' ' separator: ignored", r));
        } else if (mresult[r] < 0) {
            std::string_view m = (*mv)[r];
            cat.assign(m.data(), msplit[r]);
            cat.append(m.substr(msplit[r] + 1));
            mresult[r] = make_symbol(cat);
        }
    }
    for (size_t r = 0; r < nm; ++r) {
        if (!msplit[r]) continue;
        std::string_view m = (*mv)[r];
        if (mleft[r] < 0) mleft[r] = symbol_of(m.substr(0, msplit[r]));
        if (mright[r] < 0) mright[r] = symbol_of(m.substr(msplit[r] + 1));
    }
    if (size_t(n_vocab) + virtual_text.size() > size_t(INT32_MAX)) err("too many BPE symbols");
    merges.build(byte_sym, size_t(n_vocab) + virtual_text.size(), mleft.data(), mright.data(), mresult.data(), nm);
    if (!virtual_text.empty())
        warnings.push_back(strfmt("%zu BPE symbols are not vocabulary entries", virtual_text.size()));

    // ---- special ids stored in the file
    auto read_id = [&](const char* key, int32_t& dst) {
        const gguf::Value* v = f.find(key);
        if (!v) return;
        if (!v->is_integer()) err(std::string(key) + " is not an integer");
        if (v->i < 0 || v->i >= n_vocab) {
            warnings.push_back(strfmt("%s = %lld is out of range: ignored", key, (long long)v->i));
            return;
        }
        dst = int32_t(v->i);
    };
    read_id("tokenizer.ggml.bos_token_id", bos);
    read_id("tokenizer.ggml.eos_token_id", eos);
    read_id("tokenizer.ggml.eot_token_id", eot);
    read_id("tokenizer.ggml.eom_token_id", eom);
    read_id("tokenizer.ggml.unknown_token_id", unk);
    read_id("tokenizer.ggml.seperator_token_id", sep);  // sic: the GGUF key is spelled this way
    read_id("tokenizer.ggml.padding_token_id", pad);
    read_id("tokenizer.ggml.mask_token_id", mask);
    read_id("tokenizer.ggml.prefix_token_id", fim_pre);  // deprecated names first,
    read_id("tokenizer.ggml.suffix_token_id", fim_suf);  // the fim_* keys win
    read_id("tokenizer.ggml.middle_token_id", fim_mid);
    read_id("tokenizer.ggml.fim_pre_token_id", fim_pre);
    read_id("tokenizer.ggml.fim_suf_token_id", fim_suf);
    read_id("tokenizer.ggml.fim_mid_token_id", fim_mid);
    read_id("tokenizer.ggml.fim_pad_token_id", fim_pad);
    read_id("tokenizer.ggml.fim_rep_token_id", fim_rep);
    read_id("tokenizer.ggml.fim_sep_token_id", fim_sep);
    add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);

    // ---- llama.cpp's detection by text. A detected token that is not
    // CONTROL is forced to CONTROL. llama.cpp picks among several candidates in
    // hash-map order; we take the first text of each list that exists.
    auto force_control = [&](int32_t id) {
        if (!(attr[size_t(id)] & kAttrControl)) {
            warnings.push_back(strfmt("token %d '%.*s' is treated as a control token", id, int(text(id).size()),
                                      text(id).data()));
            attr[size_t(id)] |= kAttrControl;
        }
    };
    auto detect = [&](int32_t& dst, std::span<const char* const> texts) {
        if (dst != kNoToken) return;
        for (const char* t : texts) {
            int32_t id = lookup(t);
            if (id >= 0) {
                dst = id;
                force_control(id);
                return;
            }
        }
    };
    detect(eot, kEotTexts);
    detect(eom, kEomTexts);
    detect(fim_pre, kFimPreTexts);
    detect(fim_suf, kFimSufTexts);
    detect(fim_mid, kFimMidTexts);
    detect(fim_pad, kFimPadTexts);
    detect(fim_rep, kFimRepTexts);
    detect(fim_sep, kFimSepTexts);

    // Control tokens named "...unused..." are placeholders.
    for (int32_t id = 0; id < n_vocab; ++id)
        if ((attr[size_t(id)] & kAttrControl) && text(id).find("unused") != std::string_view::npos)
            attr[size_t(id)] |= kAttrUnused;

    // ---- end-of-generation set
    for (int32_t id : {fim_pad, fim_rep, fim_sep})
        if (id != kNoToken) eog.push_back(id);
    for (const char* t : kEogTexts) {
        int32_t id = lookup(t);
        if (id < 0) continue;
        eog.push_back(id);
        force_control(id);
    }
    for (int32_t id : {eos, eot, eom})
        if (id != kNoToken) eog.push_back(id);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    auto eog_remove = [&](int32_t id, uint8_t new_attr) {
        eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
        attr[size_t(id)] = new_attr;
    };
    auto in_eog = [&](const char* t) {
        int32_t id = lookup(t);
        return id >= 0 && std::binary_search(eog.begin(), eog.end(), id) ? id : kNoToken;
    };
    // gpt-oss style vocabularies: "<|end|>" is a turn separator, not an end.
    if (int32_t end = in_eog("<|end|>"); end != kNoToken) {
        if ((in_eog("<|return|>") != kNoToken && in_eog("<|call|>") != kNoToken) ||
            (in_eog("<|calls|>") != kNoToken && in_eog("<|flush|>") != kNoToken))
            eog_remove(end, kAttrUserDefined);
    }
    // Vocabularies with "<|tool_response>" use "</s>" as plain text.
    if (int32_t s = in_eog("</s>"); s != kNoToken && in_eog("<|tool_response>") != kNoToken) eog_remove(s, kAttrNormal);

    // ---- special tokens matched in raw text, longest first
    for (int32_t id = 0; id < n_vocab; ++id)
        if (attr[size_t(id)] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) specials.push_back(id);
    std::stable_sort(specials.begin(), specials.end(),
                     [this](int32_t a, int32_t b) { return text(a).size() > text(b).size(); });
    for (int32_t id : specials)
        if (special_first_bytes.find(text(id)[0]) == std::string::npos) special_first_bytes += text(id)[0];

    // ---- rendered bytes of every token (what the detokenizer prints)
    render_arena.reserve(text_arena.size());
    render_off.resize(size_t(n_vocab) + 1);
    size_t bad_tokens = 0;
    for (int32_t id = 0; id < n_vocab; ++id) {
        render_off[size_t(id)] = uint32_t(render_arena.size());
        const uint8_t a = attr[size_t(id)];
        std::string_view t = text(id);
        if (a & (kAttrControl | kAttrUnknown | kAttrUserDefined)) {
            render_arena.append(t.data(), t.size());
        } else if (a & kAttrNormal) {
            const auto* s = reinterpret_cast<const unsigned char*>(t.data());
            bool bad = false;
            for (size_t i = 0; i < t.size();) {
                unicode::Decoded d = unicode::decode_utf8(s, t.size(), i);
                i += d.len;
                int b = d.cp == unicode::kInvalidByte ? -1 : unicode::cp_to_byte(d.cp);
                if (b < 0) {
                    bad = true;
                    render_arena += "\xEF\xBF\xBD";  // U+FFFD
                } else {
                    render_arena += char(b);
                }
            }
            bad_tokens += bad;
        } else if (a & kAttrByte) {
            int b = parse_byte_token(t);
            if (b >= 0) render_arena += char(b);
        }
        if (render_arena.size() >= UINT32_MAX) err("rendered token texts exceed 4 GiB");
    }
    render_off[size_t(n_vocab)] = uint32_t(render_arena.size());
    if (bad_tokens)
        warnings.push_back(strfmt("%zu normal tokens contain characters outside the byte-level alphabet (shown as U+FFFD)",
                                  bad_tokens));
}

}  // namespace qinfer
