// Validation of `POST /v1/sessions/{sid}/messages` bodies: every rejection names the field.
#include "channels/http/api.hpp"

#include <baton/json_text.hpp>

namespace baton::http {

bool valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* end = p + s.size();
    while (p < end) {
        unsigned char c = *p;
        if (c < 0x80) {
            ++p;
            continue;
        }
        int n = 0;
        std::uint32_t cp = 0;
        if ((c & 0xE0) == 0xC0)
            n = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            n = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            n = 3, cp = c & 0x07;
        else
            return false;
        if (end - p <= n) return false;
        for (int i = 1; i <= n; ++i) {
            if ((p[i] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        p += n + 1;
    }
    return true;
}

std::optional<api_error> parse_message_body(std::string_view body, accept_request& out) {
    if (!valid_utf8(body)) return api_error{errc::invalid_json, "the body is not valid UTF-8"};
    boost::system::error_code ec;
    json::value doc = json::parse(body, ec);
    if (ec) return api_error{errc::invalid_json, "the body is not valid JSON: " + ec.message()};
    auto* obj = doc.if_object();
    if (!obj) return api_error{errc::invalid_request, "the body must be a JSON object"};
    // json::parse kept the last of a key given twice; which one the client meant is a guess.
    if (auto dup = first_duplicate_key(body))
        return api_error{errc::invalid_request, *dup + ": duplicate key"};

    for (auto& kv : *obj) {
        std::string_view key = kv.key();
        const json::value& v = kv.value();
        if (key == "text") {
            if (!v.is_string()) return api_error{errc::invalid_request, "text: expected string"};
            out.text = v.get_string();
        } else if (key == "agent") {
            if (!v.is_string()) return api_error{errc::invalid_request, "agent: expected string"};
            out.agent = v.get_string();
            if (out.agent.empty()) return api_error{errc::invalid_request, "agent: must not be empty"};
        } else if (key == "metadata") {
            if (!v.is_object()) return api_error{errc::invalid_request, "metadata: expected object"};
            out.metadata = v.get_object();
        } else if (key == "deliver") {
            if (v.is_null()) continue;
            if (!v.is_object()) return api_error{errc::invalid_request, "deliver: expected object"};
            for (auto& d : v.get_object()) {
                if (d.key() != "channel" && d.key() != "to")
                    return api_error{errc::invalid_request,
                                     "deliver." + std::string(d.key()) + ": unknown field"};
                if (!d.value().is_string())
                    return api_error{errc::invalid_request,
                                     "deliver." + std::string(d.key()) + ": expected string"};
            }
            if (!v.get_object().contains("channel"))
                return api_error{errc::invalid_request, "deliver.channel: required"};
            out.deliver = v;
        } else {
            return api_error{errc::invalid_request, std::string(key) + ": unknown field"};
        }
    }
    if (!obj->contains("text")) return api_error{errc::invalid_request, "text: required"};
    if (out.text.empty()) return api_error{errc::invalid_request, "text: must not be empty"};
    return std::nullopt;
}

} // namespace baton::http
