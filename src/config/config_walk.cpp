#include "src/config/config_walk.hpp"

#include <baton/types.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace baton::detail {

namespace json = boost::json;

namespace {

std::string line_column(std::string_view text, std::size_t offset) {
    offset = std::min(offset, text.size());
    std::size_t line = 1;
    std::size_t column = 1;
    for (std::size_t i = 0; i < offset; ++i) {
        if (text[i] == '\n') {
            ++line;
            column = 1;
        } else {
            ++column;
        }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

} // namespace

json::value parse_json_strict(std::string_view text, config_errors& errors) {
    json::parser p;
    json::error_code ec;
    std::size_t used = p.write_some(text.data(), text.size(), ec);
    if (!ec && used < text.size()) ec = json::error::extra_data;
    if (ec) {
        errors.push_back({"", "invalid JSON at " + line_column(text, used) + ": " + ec.message()});
        return nullptr;
    }
    for_each_duplicate_key(text, [&](const std::string& path) {
        errors.push_back({path, "duplicate key"});
    });
    return p.release();
}

bool read_string(config_errors& errors, const json::value& v, const std::string& path,
                 std::string& out) {
    if (!v.is_string()) {
        errors.push_back({path, "expected string"});
        return false;
    }
    // No config string means anything with a NUL in it (a path would be cut short there).
    if (v.get_string().find('\0') != json::string::npos) {
        errors.push_back({path, "must not contain a NUL character"});
        return false;
    }
    out.assign(v.get_string().data(), v.get_string().size());
    return true;
}

bool read_bool(config_errors& errors, const json::value& v, const std::string& path, bool& out) {
    if (!v.is_bool()) {
        errors.push_back({path, "expected boolean"});
        return false;
    }
    out = v.get_bool();
    return true;
}

bool read_int(config_errors& errors, const json::value& v, const std::string& path, std::int64_t& out,
              std::int64_t min, std::int64_t max) {
    // to_number accepts 1e3 (a double with an exact integer value) but not 1.5 or true.
    json::error_code ec;
    std::int64_t n = v.is_number() ? v.to_number<std::int64_t>(ec) : 0;
    // A whole number too big for 64 bits (1e30, 2^64) is out of range, not "not an integer".
    bool whole_but_huge = ec && (v.is_uint64() || (v.is_double() && std::isfinite(v.get_double()) &&
                                                   std::trunc(v.get_double()) == v.get_double()));
    if (!v.is_number() || (ec && !whole_but_huge)) {
        errors.push_back({path, "expected integer"});
        return false;
    }
    if (whole_but_huge || n < min || n > max) {
        bool too_big = whole_but_huge ? (v.is_uint64() || v.get_double() > 0) : n > max;
        std::string range =
            max == std::numeric_limits<std::int64_t>::max() && !too_big
                ? "must be >= " + std::to_string(min)
                : "must be between " + std::to_string(min) + " and " + std::to_string(max);
        errors.push_back({path, std::move(range)});
        return false;
    }
    out = n;
    return true;
}

bool read_number(config_errors& errors, const json::value& v, const std::string& path, double& out) {
    if (!v.is_number()) {
        errors.push_back({path, "expected number"});
        return false;
    }
    out = v.to_number<double>();
    return true;
}

const json::object* as_object(config_errors& errors, const json::value& v, const std::string& path) {
    if (!v.is_object()) errors.push_back({path, "expected object"});
    return v.if_object();
}

const json::array* as_array(config_errors& errors, const json::value& v, const std::string& path) {
    if (!v.is_array()) errors.push_back({path, "expected array"});
    return v.if_array();
}

object_reader::object_reader(config_errors& errors, const json::value& v, std::string path,
                             std::initializer_list<std::string_view> keys)
    : errors_(errors), obj_(as_object(errors, v, path)), path_(std::move(path)) {
    if (obj_ == nullptr) return;
    for (const auto& member : *obj_) {
        std::string_view key(member.key().data(), member.key().size());
        if (std::find(keys.begin(), keys.end(), key) == keys.end())
            errors_.push_back({this->path(key), "unknown key"});
    }
}

const json::value* object_reader::find(std::string_view key) const {
    return obj_ == nullptr ? nullptr : obj_->if_contains(json::string_view(key.data(), key.size()));
}

void object_reader::fail(std::string_view key, std::string message) const {
    errors_.push_back({key.empty() ? path_ : path(key), std::move(message)});
}

bool object_reader::require(std::string_view key) const {
    if (obj_ == nullptr) return false;
    if (!has(key)) fail(key, "required");
    return has(key);
}

bool object_reader::read(std::string_view key, std::string& out) const {
    const json::value* v = find(key);
    return v != nullptr && read_string(errors_, *v, path(key), out);
}

bool object_reader::read_text(std::string_view key, std::string& out) const {
    std::string s;
    if (!read(key, s)) return false;
    if (s.empty()) {
        fail(key, "must not be empty");
        return false;
    }
    out = std::move(s);
    return true;
}

bool object_reader::read(std::string_view key, bool& out) const {
    const json::value* v = find(key);
    return v != nullptr && read_bool(errors_, *v, path(key), out);
}

bool object_reader::read(std::string_view key, std::int64_t& out, std::int64_t min,
                         std::int64_t max) const {
    const json::value* v = find(key);
    return v != nullptr && read_int(errors_, *v, path(key), out, min, max);
}

bool object_reader::read(std::string_view key, std::chrono::milliseconds& out, std::int64_t min) const {
    std::int64_t ms = 0;
    // At most ten years: a deadline of now plus more overflows the clock's nanoseconds (found by a
    // new-user check: 1e16 ms timed every request out at once, and a heartbeat of it busy-looped).
    if (!read(key, ms, min, max_duration_ms)) return false;
    out = std::chrono::milliseconds(ms);
    return true;
}

bool object_reader::read(std::string_view key, std::vector<std::string>& out) const {
    const json::array* a = array(key);
    if (a == nullptr) return false;
    std::vector<std::string> items(a->size());
    bool ok = true;
    for (std::size_t i = 0; i < a->size(); ++i)
        ok = read_string(errors_, (*a)[i], json_index_path(path(key), i), items[i]) && ok;
    if (ok) out = std::move(items);
    return ok;
}

const json::object* object_reader::object(std::string_view key) const {
    const json::value* v = find(key);
    return v == nullptr ? nullptr : as_object(errors_, *v, path(key));
}

const json::array* object_reader::array(std::string_view key) const {
    const json::value* v = find(key);
    return v == nullptr ? nullptr : as_array(errors_, *v, path(key));
}

bool conninfo_names_password(std::string_view c) {
    for (std::string_view scheme : {"postgresql://", "postgres://"}) {
        if (!c.starts_with(scheme)) continue;
        auto rest = c.substr(scheme.size());
        auto authority = rest.substr(0, rest.find_first_of("/?"));
        auto at = authority.rfind('@');
        if (at != std::string_view::npos && authority.substr(0, at).find(':') != std::string_view::npos)
            return true;
        auto query = rest.find('?');
        if (query == std::string_view::npos) return false;
        for (auto params = rest.substr(query + 1); !params.empty();) {
            auto amp = params.find('&');
            if (params.substr(0, amp).starts_with("password=")) return true;
            params = amp == std::string_view::npos ? std::string_view{} : params.substr(amp + 1);
        }
        return false;
    }
    // Keywords: `password`, then optional spaces and `=`, at the start or after a space.
    for (std::size_t i = c.find("password"); i != std::string_view::npos; i = c.find("password", i + 1)) {
        if (i > 0 && c[i - 1] != ' ' && c[i - 1] != '\t' && c[i - 1] != '\n') continue;
        auto j = c.find_first_not_of(" \t", i + 8);
        if (j != std::string_view::npos && c[j] == '=') return true;
    }
    return false;
}

bool is_http_url(std::string_view s) {
    // http:// or https://, a host, an optional port of 1-65535, and no white space or control
    // character anywhere (found by a new-user check: `http://:99999` and `http://a b` were taken,
    // and every turn failed).
    std::string_view rest;
    if (s.starts_with("http://"))
        rest = s.substr(7);
    else if (s.starts_with("https://"))
        rest = s.substr(8);
    else
        return false;
    if (std::any_of(s.begin(), s.end(),
                    [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; }))
        return false;
    auto authority = rest.substr(0, rest.find_first_of("/?#"));
    if (auto at = authority.rfind('@'); at != std::string_view::npos) authority.remove_prefix(at + 1);
    std::string_view host = authority, port;
    if (authority.starts_with('[')) {
        auto close = authority.find(']');
        if (close == std::string_view::npos) return false;
        host = authority.substr(0, close + 1);
        auto after = authority.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':') return false;
            port = after.substr(1);
            if (port.empty()) return false;
        }
    } else if (auto colon = authority.rfind(':'); colon != std::string_view::npos) {
        host = authority.substr(0, colon);
        port = authority.substr(colon + 1);
        if (port.empty()) return false;
    }
    if (host.empty() || host == "[]") return false;
    if (!port.empty()) {
        if (port.size() > 5 ||
            !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
            return false;
        int n = std::stoi(std::string(port));
        if (n < 1 || n > 65535) return false;
    }
    return true;
}

} // namespace baton::detail
