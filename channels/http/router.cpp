#include "channels/http/router.hpp"

#include <boost/url/decode_view.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/parse_query.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <vector>

namespace baton::http {

namespace {
struct pattern {
    std::string_view method;
    std::vector<std::string_view> parts; // "{sid}" and "{tid}" are parameters
    route_id id;
};

const std::vector<pattern>& patterns() {
    static const std::vector<pattern> table{
        {"POST", {"v1", "sessions", "{sid}", "messages"}, route_id::post_message},
        {"GET", {"v1", "turns", "{tid}"}, route_id::get_turn},
        {"POST", {"v1", "turns", "{tid}", "cancel"}, route_id::cancel_turn},
        {"GET", {"v1", "sessions", "{sid}"}, route_id::get_session},
        {"GET", {"v1", "sessions", "{sid}", "tape"}, route_id::get_tape},
        {"GET", {"v1", "turns", "{tid}", "events"}, route_id::turn_events},
        {"GET", {"v1", "ws"}, route_id::websocket},
        {"GET", {"v1", "outbox"}, route_id::list_outbox},
        {"GET", {"v1", "usage"}, route_id::usage},
        {"GET", {"healthz"}, route_id::healthz},
        {"GET", {"readyz"}, route_id::readyz},
        {"GET", {"metrics"}, route_id::metrics},
        {"GET", {}, route_id::web_page},
    };
    return table;
}

// The longest pattern has four parts; a path with more segments matches none.
constexpr std::size_t max_segments = 5;
using segments = std::array<std::string, max_segments>;

bool matches(const pattern& p, const segments& segs, std::size_t n) {
    if (p.parts.size() != n) return false;
    for (std::size_t i = 0; i < n; ++i)
        if (p.parts[i] != "{sid}" && p.parts[i] != "{tid}" && p.parts[i] != segs[i]) return false;
    return true;
}
} // namespace

route_match match_route(std::string_view method, std::string_view target) {
    route_match m;
    auto parsed = boost::urls::parse_origin_form(target);
    if (!parsed) {
        m.error = errc::invalid_request;
        return m;
    }
    // Decoded segments in place: a request is routed without allocating, but for a long id.
    segments segs;
    std::size_t n = 0;
    for (auto seg : parsed->encoded_segments()) {
        if (n == max_segments) {
            n = max_segments + 1; // too long for any route
            break;
        }
        auto decoded = *seg;
        segs[n].resize(decoded.size());
        std::copy(decoded.begin(), decoded.end(), segs[n].begin());
        ++n;
    }
    // A trailing slash ("/v1/turns/x/") names the same resource.
    if (n > 0 && n <= max_segments && segs[n - 1].empty()) --n;
    m.query = std::string(parsed->encoded_query());

    bool path_known = false;
    for (const auto& p : patterns()) {
        if (!matches(p, segs, n)) continue;
        path_known = true;
        if (!m.allow.empty()) m.allow += ", ";
        m.allow += p.method;
        if (p.method == "GET") m.allow += ", HEAD";
        // HEAD is GET without the body (RFC 9110 9.3.2): the server leaves the body out.
        if (p.method == method || (p.method == "GET" && method == "HEAD")) {
            m.allow.clear();
            m.id = p.id;
            for (std::size_t i = 0; i < n; ++i) {
                if (p.parts[i] == "{sid}") m.session_id = std::move(segs[i]);
                if (p.parts[i] == "{tid}") m.turn_id = std::move(segs[i]);
            }
            return m;
        }
    }
    m.error = path_known ? errc::method_not_allowed : errc::not_found;
    return m;
}

query_text query_param(std::string_view query, std::string_view name) {
    query_text r;
    auto parsed = boost::urls::parse_query(query);
    if (!parsed) {
        r.error = "malformed query string";
        return r;
    }
    // Keys and values are percent-decoded (`?wait=%33` is `wait=3`), as the path's segments are.
    for (auto param : *parsed) {
        if (param.key.decode() != name) continue;
        if (r.value) {
            // Which of two values was meant is a guess; the client is told instead.
            r.value.reset();
            r.error = std::string(name) + ": given more than once";
            return r;
        }
        r.value = param.value.decode();
    }
    return r;
}

query_int query_param_int(std::string_view query, std::string_view name) {
    query_int r;
    auto text = query_param(query, name);
    if (!text.value) {
        r.error = std::move(text.error);
        return r;
    }
    std::string_view v = *text.value;
    std::int64_t n = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc{} || end != v.data() + v.size() || n < 0)
        r.error = std::string(name) + ": expected a non-negative integer";
    else
        r.value = n;
    return r;
}

query_wait query_param_wait(std::string_view query) {
    query_wait r;
    auto text = query_param(query, "wait");
    if (!text.value) {
        r.error = std::move(text.error);
        return r;
    }
    const auto* v = &*text.value;
    // Whole seconds, then up to three decimals: milliseconds, without floating point.
    std::int64_t ms = 0;
    std::size_t i = 0, digits = 0, decimals = 0;
    bool ok = !v->empty();
    for (; ok && i < v->size() && (*v)[i] != '.'; ++i, ++digits) {
        ok = std::isdigit(static_cast<unsigned char>((*v)[i])) && digits < 3;
        ms = ms * 10 + ((*v)[i] - '0');
    }
    ms *= 1000;
    if (ok && i < v->size()) { // the '.'
        ++i;
        ok = i < v->size() && digits > 0;
        std::int64_t scale = 100;
        for (; ok && i < v->size(); ++i, ++decimals, scale /= 10) {
            ok = std::isdigit(static_cast<unsigned char>((*v)[i])) && decimals < 3;
            ms += ((*v)[i] - '0') * scale;
        }
    }
    ok = ok && digits > 0;
    if (!ok) {
        r.error = "wait: expected a number of seconds from 0 to 60, such as 30 or 2.5";
        return r;
    }
    if (ms > 60000) {
        r.error = "wait: at most 60 seconds";
        return r;
    }
    r.value = std::chrono::milliseconds(ms);
    return r;
}

} // namespace baton::http
