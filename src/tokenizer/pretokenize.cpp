#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace qinfer {
namespace {

struct Cp {
    uint32_t cp = 0;
    uint32_t len = 0;   // 0: past the end of the fragment
    uint8_t flags = 0;  // 0: past the end of the fragment
};

class Scanner {
public:
    explicit Scanner(std::string_view t) : s_(reinterpret_cast<const unsigned char*>(t.data())), n_(t.size()) {}
    size_t size() const { return n_; }
    Cp at(size_t p) const {
        if (p >= n_) return {};
        if (s_[p] < 0x80) return {s_[p], 1, unicode::cp_flags(s_[p])};
        unicode::Decoded d = unicode::decode_utf8(s_, n_, p);
        return {d.cp, d.len, unicode::cp_flags(d.cp)};
    }
    bool is_crlf(size_t p) const { return p < n_ && (s_[p] == '\r' || s_[p] == '\n'); }

private:
    const unsigned char* s_;
    size_t n_;
};

bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// `word` is the class set of a letter run: \p{L} (qwen2) or [\p{L}\p{M}] (qwen35);
// `not_other` the classes that end a punctuation run (\s, \p{N}, plus `word`).
void scan(const Scanner& sc, uint8_t word, std::vector<size_t>& ends) {
    using namespace unicode;
    const uint8_t not_other = uint8_t(kWhitespace | kNumber | word);
    const size_t n = sc.size();
    size_t pos = 0;
    while (pos < n) {
        const Cp c = sc.at(pos);
        const size_t next = pos + c.len;

        // 1. Contractions: 's 't 'm 'd 're 've 'll, any ASCII case.
        if (c.cp == '\'' && next < n) {
            const Cp c1 = sc.at(next);
            const uint32_t l1 = to_lower(c1.cp);
            if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') {
                ends.push_back(pos = next + c1.len);
                continue;
            }
            const Cp c2 = sc.at(next + c1.len);
            if (c2.len) {
                const uint32_t l2 = to_lower(c2.cp);
                if ((l1 == 'r' && l2 == 'e') || (l1 == 'v' && l2 == 'e') || (l1 == 'l' && l2 == 'l')) {
                    ends.push_back(pos = next + c1.len + c2.len);
                    continue;
                }
            }
        }

        // 2. Word: one optional character that is not CR, LF or a number, then letters.
        if (!is_crlf(c.cp) && !(c.flags & kNumber) && ((c.flags & word) || (sc.at(next).flags & word))) {
            size_t e = next;
            for (Cp d = sc.at(e); d.flags & word; d = sc.at(e)) e += d.len;
            ends.push_back(pos = e);
            continue;
        }

        // 3. A single number character.
        if (c.flags & kNumber) {
            ends.push_back(pos = next);
            continue;
        }

        // 4. Optional space, run of "other" characters, trailing CR/LF.
        const Cp c2 = (c.cp == ' ') ? sc.at(next) : c;
        if (c2.flags && !(c2.flags & not_other)) {
            size_t e = (c.cp == ' ') ? next : pos;
            for (Cp d = sc.at(e); d.flags && !(d.flags & not_other); d = sc.at(e)) e += d.len;
            while (sc.is_crlf(e)) ++e;
            ends.push_back(pos = e);
            continue;
        }

        // 5. Whitespace run: up to its last CR/LF; else all but its last
        //    character when something follows; else all of it.
        size_t k = 0, e = pos, last_start = pos, after_nl = 0;
        for (Cp d = sc.at(e); d.flags & kWhitespace; d = sc.at(e)) {
            last_start = e;
            e += d.len;
            ++k;
            if (is_crlf(d.cp)) after_nl = e;
        }
        if (after_nl) {
            ends.push_back(pos = after_nl);
        } else if (k >= 2 && e < n) {
            ends.push_back(pos = last_start);
        } else if (k >= 1) {
            ends.push_back(pos = e);
        } else {
            ends.push_back(pos = next);  // 6. unreachable with complete tables
        }
    }
}

}  // namespace

void pretokenize(PreTokenizer pre, std::string_view text, std::vector<size_t>& ends) {
    const uint8_t word = pre == PreTokenizer::Qwen35 ? uint8_t(unicode::kLetter | unicode::kMark) : uint8_t(unicode::kLetter);
    scan(Scanner(text), word, ends);
}

}  // namespace qinfer
