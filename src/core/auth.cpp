#include <baton/auth.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <stdexcept>

namespace baton {

namespace {
std::array<unsigned char, 32> digest_of(std::string_view token) {
    std::array<unsigned char, 32> out{};
    unsigned int n = 0;
    EVP_Digest(token.data(), token.size(), out.data(), &n, EVP_sha256(), nullptr);
    return out;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool b64token_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~' || c == '+' || c == '/';
}

// RFC 7230 tchar: what a subprotocol name (an HTTP token) is made of.
bool tchar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}
} // namespace

authenticator::authenticator(const std::vector<token_config>& tokens) {
    for (const auto& t : tokens) {
        entry e;
        if (t.sha256.size() != 64) throw std::invalid_argument("server.tokens: sha256: expected 64 hex characters");
        for (std::size_t i = 0; i < 32; ++i) {
            int hi = hex_value(t.sha256[2 * i]), lo = hex_value(t.sha256[2 * i + 1]);
            if (hi < 0 || lo < 0)
                throw std::invalid_argument("server.tokens: sha256: expected 64 hex characters");
            e.digest[i] = static_cast<unsigned char>(hi * 16 + lo);
        }
        e.who.tenant = t.tenant;
        e.who.tenant_scope = false;
        e.who.admin = false;
        for (const auto& s : t.scopes) {
            if (s == "tenant") e.who.tenant_scope = true;
            if (s == "admin") e.who.admin = true;
        }
        entries_.push_back(std::move(e));
    }
}

std::optional<caller> authenticator::authenticate(std::string_view token) const {
    if (token.empty()) return std::nullopt;
    auto d = digest_of(token);
    const entry* found = nullptr;
    for (const auto& e : entries_) {
        // Every entry is compared whole; the branch on the result is not on secret data's prefix.
        bool same = CRYPTO_memcmp(d.data(), e.digest.data(), d.size()) == 0;
        if (same) found = &e;
    }
    if (!found) return std::nullopt;
    return found->who;
}

std::optional<std::string_view> parse_bearer(std::string_view h) {
    h = trim(h);
    constexpr std::string_view scheme = "bearer";
    if (h.size() <= scheme.size()) return std::nullopt;
    for (std::size_t i = 0; i < scheme.size(); ++i) {
        char c = h[i];
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != scheme[i]) return std::nullopt;
    }
    if (h[scheme.size()] != ' ') return std::nullopt;
    auto token = trim(h.substr(scheme.size()));
    if (token.empty()) return std::nullopt;
    // b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
    std::size_t i = 0;
    while (i < token.size() && b64token_char(token[i]))
        ++i;
    if (i == 0) return std::nullopt;
    while (i < token.size() && token[i] == '=')
        ++i;
    if (i != token.size()) return std::nullopt;
    return token;
}

ws_protocol_offer parse_ws_protocols(std::string_view header) {
    ws_protocol_offer out;
    constexpr std::string_view prefix = "bearer.";
    while (!header.empty()) {
        auto comma = header.find(',');
        auto item = trim(header.substr(0, comma));
        header = comma == std::string_view::npos ? std::string_view() : header.substr(comma + 1);
        if (item.empty()) continue;
        bool ok = true;
        for (char c : item)
            ok = ok && tchar(c);
        if (!ok) {
            out.malformed = true;
            continue;
        }
        if (item == "baton.v1")
            out.baton_v1 = true;
        else if (item.size() > prefix.size() && item.starts_with(prefix))
            out.token = item.substr(prefix.size());
    }
    return out;
}

std::string make_token() {
    unsigned char bytes[32];
    if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("cannot make a random token");
    static constexpr char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    std::string out = "bt_";
    // 32 bytes: ten groups of three (four characters each), then two bytes (three characters).
    std::size_t i = 0;
    for (; i + 3 <= sizeof bytes; i += 3) {
        unsigned v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
        for (int k = 3; k >= 0; --k)
            out += alphabet[(v >> (6 * k)) & 63];
    }
    unsigned v = (bytes[i] << 8) | bytes[i + 1];
    out += alphabet[(v >> 10) & 63];
    out += alphabet[(v >> 4) & 63];
    out += alphabet[(v << 2) & 63];
    OPENSSL_cleanse(bytes, sizeof bytes);
    return out;
}

} // namespace baton
