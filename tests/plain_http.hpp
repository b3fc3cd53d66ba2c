// A blocking HTTP/1.1 exchange over loopback for test threads: Boost.Test's macros are not
// thread-safe (every check writes its checkpoint), so a thread other than the test's own calls
// this, which uses none, and the test checks what it returns. One connection per request
// (Connection: close); every step bounded by `timeout`.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton::test {

struct plain_response {
    unsigned status = 0;
    std::vector<std::pair<std::string, std::string>> headers; // names as sent
    std::string body;
};

// nullopt (and `error` says why) when there is no complete response in time.
inline std::optional<plain_response>
plain_request(const std::string& host, unsigned short port, std::string_view method,
              std::string_view target, std::string_view body,
              const std::vector<std::pair<std::string, std::string>>& headers,
              std::chrono::milliseconds timeout, std::string& error) {
    using steady = std::chrono::steady_clock;
    auto deadline = steady::now() + timeout;
    auto left = [&] {
        auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()).count();
        return static_cast<int>(ms < 0 ? 0 : ms);
    };
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        error = std::string("socket: ") + std::strerror(errno);
        return std::nullopt;
    }
    struct closer {
        int fd;
        ~closer() { ::close(fd); }
    } guard{fd};
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
        error = "bad address " + host;
        return std::nullopt;
    }
    auto wait = [&](short events) {
        pollfd p{fd, events, 0};
        return ::poll(&p, 1, left()) == 1;
    };
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (errno != EINPROGRESS || !wait(POLLOUT) ||
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
            error = "connect failed";
            return std::nullopt;
        }
    }
    std::string req = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: " + host +
                      "\r\nConnection: close\r\n";
    bool has_type = false;
    for (auto& [k, v] : headers) {
        req += k + ": " + v + "\r\n";
        if (k == "Content-Type") has_type = true;
    }
    if (!body.empty() || method == "POST") {
        if (!has_type) req += "Content-Type: application/json\r\n";
        req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n";
    req += body;
    std::string_view out = req;
    while (!out.empty()) {
        auto n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN && wait(POLLOUT)) continue;
        if (n <= 0) {
            error = "write failed";
            return std::nullopt;
        }
        out.remove_prefix(static_cast<std::size_t>(n));
    }
    std::string in;
    char buf[16384];
    for (;;) {
        auto n = ::recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            in.append(buf, static_cast<std::size_t>(n));
            continue;
        }
        if (n == 0) break;
        if (errno == EAGAIN && wait(POLLIN)) continue;
        error = in.empty() ? "no response in time" : "the response was cut off";
        return std::nullopt;
    }
    auto end = in.find("\r\n\r\n");
    if (end == std::string::npos || in.compare(0, 9, "HTTP/1.1 ") != 0) {
        error = "malformed response";
        return std::nullopt;
    }
    plain_response r;
    r.status = static_cast<unsigned>(std::strtoul(in.c_str() + 9, nullptr, 10));
    std::size_t at = in.find("\r\n") + 2;
    std::optional<std::size_t> length;
    while (at < end) {
        auto eol = in.find("\r\n", at);
        auto line = in.substr(at, eol - at);
        auto colon = line.find(':');
        if (colon != std::string::npos) {
            auto name = line.substr(0, colon);
            auto value = line.substr(colon + 1);
            while (!value.empty() && value.front() == ' ')
                value.erase(0, 1);
            if (strcasecmp(name.c_str(), "Content-Length") == 0)
                length = std::strtoul(value.c_str(), nullptr, 10);
            r.headers.emplace_back(std::move(name), std::move(value));
        }
        at = eol + 2;
    }
    r.body = in.substr(end + 4);
    if (length && r.body.size() < *length) {
        error = "the body was cut off";
        return std::nullopt;
    }
    if (length) r.body.resize(*length);
    return r;
}

// For test threads too: a string member of a JSON body ("" when absent), and the code of its
// {"error": {"code"}}.
inline std::string json_field(const std::string& body, const char* name) {
    std::error_code ec;
    auto v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) return {};
    auto* x = v.as_object().if_contains(name);
    return x && x->is_string() ? std::string(x->as_string()) : std::string();
}
inline std::string error_code_of(const std::string& body) {
    std::error_code ec;
    auto v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) return {};
    auto* e = v.as_object().if_contains("error");
    if (!e || !e->is_object()) return {};
    auto* c = e->as_object().if_contains("code");
    return c && c->is_string() ? std::string(c->as_string()) : std::string();
}

} // namespace baton::test
