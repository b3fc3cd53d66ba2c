// End-to-end test support: runs the real `baton` binary (BATON_CLI_PATH) as a child process on
// 127.0.0.1:0 with a fresh data directory, and talks to it only as a user can, over TCP. Every wait
// has a deadline, so a hung daemon fails the test instead of hanging it.
#pragma once

#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/types.h>

namespace baton::test {

namespace json = boost::json;
using namespace std::chrono_literals;

using header_list = std::vector<std::pair<std::string, std::string>>;

struct http_response {
    unsigned status = 0;
    header_list headers;
    std::string body;
    json::value json; // null when the body is not JSON
    bool keep_alive = false;
    // The first header of that name (case-insensitive), if any.
    std::optional<std::string> header(std::string_view name) const;
};

// A directory of its own under the system temp dir, removed with everything in it.
struct scratch_dir {
    std::filesystem::path root;
    scratch_dir();
    ~scratch_dir();
    scratch_dir(const scratch_dir&) = delete;
    scratch_dir& operator=(const scratch_dir&) = delete;
};

// An HTTP/1.1 request as bytes: Host, the given headers, and for a body (or any POST) a
// Content-Length and, unless given, `Content-Type: application/json`.
std::string format_request(std::string_view method, std::string_view target, std::string_view body = {},
                           const header_list& headers = {});

// One TCP connection to the daemon; each call has its own deadline (`timeout` from its start).
class connection {
public:
    connection(const std::string& host, unsigned short port, std::chrono::milliseconds timeout = 10s);
    ~connection();
    connection(connection&&) noexcept;
    connection& operator=(connection&&) noexcept;

    // Writes every byte; false when the peer is gone or the deadline passed.
    bool write(std::string_view bytes);
    // Reads the next response; nullopt (see last_error) on close, timeout or a malformed response.
    // `head`: the answer to a HEAD request, which has no body whatever its Content-Length says.
    std::optional<http_response> read_response(bool head = false);
    // Writes a request and reads its response; fails the test when there is none.
    http_response request(std::string_view method, std::string_view target, std::string_view body = {},
                          const header_list& headers = {});

    struct drained {
        std::string bytes; // everything received until the end
        bool closed;       // the peer closed (FIN or RST) before the deadline
    };
    // Reads until the peer closes the connection or the deadline passes.
    drained read_until_close();
    // Reads until what was received contains every one of `needles`, the peer closes or the
    // deadline passes; returns all that was received.
    std::string read_until_seen(const std::vector<std::string>& needles);
    std::string last_error() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// A running `baton serve` child. Only this pid is ever signalled.
class daemon_process {
public:
    // Starts `baton <args...>` with stderr appended to `log_file`, and waits (bounded) for
    // `listening on http://HOST:PORT` on stdout; fails the test if it does not come.
    daemon_process(const std::vector<std::string>& args, const std::filesystem::path& log_file,
                   std::chrono::milliseconds startup_limit = 10s);
    ~daemon_process();
    daemon_process(const daemon_process&) = delete;
    daemon_process& operator=(const daemon_process&) = delete;

    const std::string& host() const { return host_; }
    unsigned short port() const { return port_; }
    bool tls() const { return tls_; } // it said https://
    pid_t pid() const { return pid_; }
    // SIGTERM, a bounded wait for the drain, then SIGKILL. Returns the exit code (128 + signal when
    // killed). Idempotent; a zero grace is an immediate SIGKILL (a crash).
    int stop(std::chrono::milliseconds grace = 15s);

private:
    pid_t pid_ = -1;
    int stdout_fd_ = -1;
    int exit_code_ = -1;
    std::string host_;
    unsigned short port_ = 0;
    bool tls_ = false;
};

struct cli_result {
    int exit_code = -1; // 128 + signal when killed
    std::string output; // stdout and stderr together
};
// Writes a whole file; fails the test when it cannot.
void write_text_file(const std::filesystem::path& p, std::string_view content);

// Runs `baton <args...>` to completion (killed after `limit`).
cli_result run_baton(const std::vector<std::string>& args, std::chrono::milliseconds limit = 10s);
// The same with `input` on its stdin, which is then closed.
cli_result run_baton(const std::vector<std::string>& args, std::string_view input,
                     std::chrono::milliseconds limit = 10s);

// A `baton` child whose stdin is a pipe the test writes, for commands driven line by line
// (`baton chat`); stdout and stderr are read together. Killed by the destructor if still running.
class cli_process {
public:
    explicit cli_process(const std::vector<std::string>& args);
    ~cli_process();
    cli_process(const cli_process&) = delete;
    cli_process& operator=(const cli_process&) = delete;

    // Writes to its stdin; false when it no longer reads it.
    bool write(std::string_view text);
    void close_stdin();
    // Reads output until it holds `needle` (true), or `limit` passes or the output ends (false).
    bool wait_for(std::string_view needle, std::chrono::milliseconds limit = 10s);
    // Everything read so far.
    const std::string& output() const { return output_; }
    void signal(int sig);
    // Closes stdin, reads the output to its end and returns the exit code (128 + signal when
    // killed); fails the test when it has not exited within `limit`.
    int wait(std::chrono::milliseconds limit = 10s);

private:
    bool read_some(std::chrono::steady_clock::time_point deadline);
    pid_t pid_ = -1;
    int in_fd_ = -1;
    int out_fd_ = -1;
    int exit_code_ = -1;
    std::string output_;
};

// A token made by `baton token new ARGS...`, as a user runs it, and the server.tokens entry it
// printed (checked to hold only the token's SHA-256).
struct issued {
    std::string token;
    std::string entry;
};
issued new_token(const std::vector<std::string>& args);

// Statuses after which a turn never changes (docs/api.md "Turn record").
const std::vector<std::string>& terminal_statuses();

// A string member, or "" when it is absent or not a string.
inline std::string string_at(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// The member names of an object.
inline std::set<std::string> keys_of(const json::object& o) {
    std::set<std::string> keys;
    for (const auto& kv : o)
        keys.emplace(kv.key());
    return keys;
}

// An integer member, or -1 when it is absent or not an integer.
inline std::int64_t int_at(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    return v && v->is_int64() ? v->get_int64() : -1;
}

// The body as a JSON object; fails the test when it is not one.
inline const json::object& body_object(const http_response& r) {
    BOOST_TEST_REQUIRE(r.json.is_object(), "status " << r.status << ", not a JSON object: " << r.body);
    return r.json.get_object();
}

// The turn id of a 202/200 answer to a POST; fails the test when there is none.
inline std::string turn_id_of(const http_response& r) {
    auto tid = string_at(body_object(r), "turn_id");
    BOOST_TEST_REQUIRE(!tid.empty(), "no turn_id in: " << r.status << " " << r.body);
    return tid;
}

// Checks the status and the one error shape of docs/api.md, exactly {"error": {"code", "message"}};
// returns the message (empty when the shape is wrong).
inline std::string check_error(const http_response& r, unsigned status, std::string_view code) {
    BOOST_TEST(r.status == status, "status " << r.status << ", body " << r.body);
    BOOST_TEST(r.header("Content-Type").value_or("").starts_with("application/json"));
    const auto* root = r.json.if_object();
    const auto* err = root && root->size() == 1 ? root->if_contains("error") : nullptr;
    const auto* e = err ? err->if_object() : nullptr;
    bool shaped = e && e->size() == 2 && e->contains("code") && e->contains("message") &&
                  e->at("code").is_string() && e->at("message").is_string();
    BOOST_TEST(shaped, "not exactly {\"error\": {\"code\", \"message\"}}: " << r.body);
    if (!shaped) return {};
    BOOST_TEST(string_at(*e, "code") == code);
    BOOST_TEST(!string_at(*e, "message").empty());
    return string_at(*e, "message");
}

// "2026-11-30T12:00:00.000Z" and the other RFC 3339 date-times.
inline bool is_rfc3339(const json::value& v) {
    static const std::regex re(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2}))");
    return v.is_string() && std::regex_match(std::string(v.get_string()), re);
}

// A daemon on a fresh data directory, started on construction unless deferred; it can be stopped
// and started again on the same directory. The destructor stops it and removes the directory.
struct daemon_fixture {
    struct deferred {};

    scratch_dir dir;
    std::unique_ptr<daemon_process> daemon;

    daemon_fixture();
    explicit daemon_fixture(deferred);
    ~daemon_fixture();

    // `serve --listen 127.0.0.1:0 --data <dir>/data <extra_args...>`.
    void start(const std::vector<std::string>& extra_args = {});
    // SIGTERM (a graceful drain, SIGKILL after `grace`); returns the exit code.
    int stop(std::chrono::milliseconds grace = 15s);
    // SIGKILL, as a crash would; returns the exit code.
    int crash() { return stop(0ms); }
    std::filesystem::path data_dir() const { return dir.root / "data"; }
    // Writes a file under the scratch dir and returns its path.
    std::filesystem::path write_file(const std::string& name, std::string_view content) const;
    // The daemon's stderr so far (for failure messages).
    std::string log() const;

    connection connect(std::chrono::milliseconds timeout = 10s) const {
        BOOST_REQUIRE_MESSAGE(daemon, "the daemon is not running");
        return connection(daemon->host(), daemon->port(), timeout);
    }
    // One request on a fresh connection.
    http_response request(std::string_view method, std::string_view target, std::string_view body = {},
                          const header_list& headers = {}) const {
        return connect().request(method, target, body, headers);
    }
    // POST /v1/sessions/{sid}/messages with {"text": text}.
    http_response post_message(std::string_view sid, std::string_view text,
                               const header_list& headers = {}) const;
    // Polls GET /v1/turns/{tid} every 10 ms up to `limit` until its status is one of `until`; fails the
    // test otherwise. Returns the last turn record.
    json::object wait_for_turn(std::string_view tid,
                               const std::vector<std::string>& until = terminal_statuses(),
                               std::chrono::milliseconds limit = 10s) const;
    // The same, each poll with `headers` (a bearer token).
    json::object wait_for_turn(std::string_view tid, const header_list& headers,
                               const std::vector<std::string>& until = terminal_statuses(),
                               std::chrono::milliseconds limit = 10s) const;
};

} // namespace baton::test
