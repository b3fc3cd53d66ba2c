#include <baton/json_text.hpp>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

namespace baton {

namespace {
// True when one of the 8 bytes of `w` must be escaped: below 0x20, '"' or '\\' (bit tricks from
// "Bit Twiddling Hacks": a zero byte of x shows in (x - 0x01..) & ~x & 0x80..).
bool needs_escape(std::uint64_t w) {
    constexpr std::uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    auto zero_byte = [&](std::uint64_t x) { return (x - ones) & ~x & highs; };
    auto below_space = (w - ones * 0x20) & ~w & highs;
    return (below_space | zero_byte(w ^ (ones * '"')) | zero_byte(w ^ (ones * '\\'))) != 0;
}

bool must_escape(unsigned char c) {
    return c < 0x20 || c == '"' || c == '\\';
}

// Where the next byte to escape is, from `i` on (s.size() when there is none): plain text, most of
// it, is skipped 8 bytes at a time, then the block that holds one is looked at byte by byte. (SSE2,
// 16 bytes at a time, measured slower for the short strings that make up most requests.)
std::size_t next_escape(std::string_view s, std::size_t i) {
    for (std::uint64_t w; i + 8 <= s.size(); i += 8) {
        std::memcpy(&w, s.data() + i, 8);
        if (needs_escape(w)) break;
    }
    for (; i < s.size(); ++i)
        if (must_escape(static_cast<unsigned char>(s[i]))) return i;
    return s.size();
}
} // namespace

void append_json_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out.push_back('"');
    std::size_t run = 0; // start of the bytes not yet copied
    for (std::size_t i = next_escape(s, 0); i < s.size(); i = next_escape(s, i)) {
        auto c = static_cast<unsigned char>(s[i]);
        out.append(s.data() + run, i - run);
        run = ++i;
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            out += "\\u00";
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    out.append(s.data() + run, s.size() - run);
    out.push_back('"');
}

namespace {
template <class Int> void append_int(std::string& out, Int n) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, n);
    out.append(buf, r.ptr);
}
} // namespace

void append_json_number(std::string& out, double d) {
    if (!std::isfinite(d)) {
        out += "null";
        return;
    }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    out.append(buf, r.ptr);
}

void append_json(std::string& out, const json::object& o) {
    out.push_back('{');
    bool first = true;
    for (const auto& kv : o) {
        if (!first) out.push_back(',');
        first = false;
        append_json_string(out, kv.key());
        out.push_back(':');
        append_json(out, kv.value());
    }
    out.push_back('}');
}

void append_json(std::string& out, const json::array& a) {
    out.push_back('[');
    bool first = true;
    for (const auto& e : a) {
        if (!first) out.push_back(',');
        first = false;
        append_json(out, e);
    }
    out.push_back(']');
}

void append_json(std::string& out, const json::value& v) {
    switch (v.kind()) {
    case json::kind::null:
        out += "null";
        return;
    case json::kind::bool_:
        out += v.get_bool() ? "true" : "false";
        return;
    case json::kind::int64:
        append_int(out, v.get_int64());
        return;
    case json::kind::uint64:
        append_int(out, v.get_uint64());
        return;
    case json::kind::double_:
        out += json::serialize(v); // rare in payloads; Boost.JSON's own format
        return;
    case json::kind::string:
        append_json_string(out, v.get_string());
        return;
    case json::kind::array:
        append_json(out, v.get_array());
        return;
    case json::kind::object:
        append_json(out, v.get_object());
        return;
    }
}

namespace {
// About the text's length (exact when nothing needs escaping), so that it is allocated once.
std::size_t text_size(const json::value& v);
std::size_t text_size(const json::object& o) {
    std::size_t n = 2;
    for (const auto& kv : o)
        n += kv.key().size() + 4 + text_size(kv.value());
    return n;
}
std::size_t text_size(const json::value& v) {
    switch (v.kind()) {
    case json::kind::string:
        return v.get_string().size() + 2;
    case json::kind::array: {
        std::size_t n = 2;
        for (const auto& e : v.get_array())
            n += text_size(e) + 1;
        return n;
    }
    case json::kind::object:
        return text_size(v.get_object());
    default:
        return 24;
    }
}
} // namespace

std::string json_text(const json::value& v) {
    std::string out;
    out.reserve(text_size(v));
    append_json(out, v);
    return out;
}

std::string json_text(const json::object& o) {
    std::string out;
    out.reserve(text_size(o));
    append_json(out, o);
    return out;
}

} // namespace baton

namespace baton {

namespace {
bool is_plain_key(std::string_view key) {
    return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '-';
    });
}

// The keys an object has had so far: a short list (most objects), a tree past it (no quadratic
// scan of a hostile object's thousands of keys).
class key_set {
public:
    bool insert(std::string key) { // false: already there
        if (many_.empty()) {
            if (std::find(few_.begin(), few_.end(), key) != few_.end()) return false;
            if (few_.size() < 8) {
                few_.push_back(std::move(key));
                return true;
            }
            for (auto& k : few_)
                many_.insert(std::move(k));
            few_.clear();
        }
        return many_.insert(std::move(key)).second;
    }

private:
    std::vector<std::string> few_;
    std::set<std::string, std::less<>> many_;
};

// A SAX handler that builds nothing: it tracks the current path and reports keys seen twice.
class duplicate_key_finder {
public:
    static constexpr std::size_t max_object_size = std::size_t(-1);
    static constexpr std::size_t max_array_size = std::size_t(-1);
    static constexpr std::size_t max_key_size = std::size_t(-1);
    static constexpr std::size_t max_string_size = std::size_t(-1);

    explicit duplicate_key_finder(const std::function<void(const std::string&)>& found)
        : found_(found) {}

    std::size_t count = 0;

    bool on_document_begin(json::error_code&) { return true; }
    bool on_document_end(json::error_code&) { return true; }
    bool on_array_begin(json::error_code&) { return begin(false); }
    bool on_array_end(std::size_t, json::error_code&) { return end(); }
    bool on_object_begin(json::error_code&) { return begin(true); }
    bool on_object_end(std::size_t, json::error_code&) { return end(); }
    bool on_string_part(json::string_view, std::size_t, json::error_code&) { return true; }
    bool on_string(json::string_view, std::size_t, json::error_code&) { return scalar(); }
    bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
        key_.append(s.data(), s.size());
        return true;
    }
    bool on_key(json::string_view s, std::size_t, json::error_code&) {
        key_.append(s.data(), s.size());
        frame& f = stack_.back();
        f.key = key_;
        if (!f.keys.insert(std::move(key_))) {
            ++count;
            found_(path());
        }
        key_.clear();
        return true;
    }
    bool on_number_part(json::string_view, json::error_code&) { return true; }
    bool on_int64(std::int64_t, json::string_view, json::error_code&) { return scalar(); }
    bool on_uint64(std::uint64_t, json::string_view, json::error_code&) { return scalar(); }
    bool on_double(double, json::string_view, json::error_code&) { return scalar(); }
    bool on_bool(bool, json::error_code&) { return scalar(); }
    bool on_null(json::error_code&) { return scalar(); }
    bool on_comment_part(json::string_view, json::error_code&) { return true; }
    bool on_comment(json::string_view, json::error_code&) { return true; }

private:
    struct frame {
        bool is_object = false;
        key_set keys;
        std::string key;       // current member of an object
        std::size_t index = 0; // current element of an array
    };

    std::string path() const {
        std::string p;
        for (const frame& f : stack_)
            p = f.is_object ? json_child_path(p, f.key) : json_index_path(p, f.index);
        return p;
    }
    bool begin(bool is_object) {
        stack_.push_back(frame{is_object, {}, {}, 0});
        return true;
    }
    bool end() {
        stack_.pop_back();
        return scalar();
    }
    bool scalar() {
        if (!stack_.empty() && !stack_.back().is_object) ++stack_.back().index;
        return true;
    }

    const std::function<void(const std::string&)>& found_;
    std::vector<frame> stack_;
    std::string key_;
};
} // namespace

std::string json_child_path(std::string_view parent, std::string_view key) {
    std::string p(parent);
    if (is_plain_key(key)) {
        if (!p.empty()) p += '.';
        p += key;
    } else {
        p += '[';
        append_json_string(p, key);
        p += ']';
    }
    return p;
}

std::string json_index_path(std::string_view parent, std::size_t index) {
    return std::string(parent) + "[" + std::to_string(index) + "]";
}

std::size_t for_each_duplicate_key(std::string_view text,
                                   const std::function<void(const std::string& path)>& found) {
    json::basic_parser<duplicate_key_finder> p(json::parse_options{}, found);
    json::error_code ec;
    p.write_some(false, text.data(), text.size(), ec);
    return p.handler().count;
}

std::optional<std::string> first_duplicate_key(std::string_view text) {
    std::optional<std::string> first;
    for_each_duplicate_key(text, [&](const std::string& path) {
        if (!first) first = path;
    });
    return first;
}

} // namespace baton
