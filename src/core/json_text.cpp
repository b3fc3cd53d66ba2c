#include <baton/json_text.hpp>

#include <boost/json/serialize.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>


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
