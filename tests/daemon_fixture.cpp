// The only test translation unit that includes Beast: the end-to-end suites see plain structs.
#include "tests/daemon_fixture.hpp"

#include <baton/types.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace baton::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace fs = std::filesystem;
using asio::ip::tcp;
using boost::system::error_code;
using steady = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
        return std::tolower(static_cast<unsigned char>(x)) ==
               std::tolower(static_cast<unsigned char>(y));
    });
}

int remaining_ms(steady::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// Waits for `events` on fd; false when the deadline passes first.
bool poll_until(int fd, short events, steady::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        int n = ::poll(&p, 1, remaining_ms(deadline));
        if (n > 0) return true;
        if (n == 0 || errno != EINTR) return false;
    }
}

// A non-blocking socket seen through a deadline: the SyncReadStream/SyncWriteStream Beast uses.
// (SO_RCVTIMEO would not do: Asio's blocking reads poll again, forever, after EAGAIN.)
struct deadline_stream {
    tcp::socket& socket;
    steady::time_point deadline;

    template <class Op> std::size_t retry(short events, error_code& ec, Op op) {
        for (;;) {
            std::size_t n = op(ec);
            if (ec != asio::error::would_block && ec != asio::error::try_again) return n;
            if (!poll_until(socket.native_handle(), events, deadline)) {
                ec = asio::error::timed_out;
                return 0;
            }
        }
    }
    template <class Buffers> std::size_t read_some(const Buffers& b, error_code& ec) {
        return retry(POLLIN, ec, [&](error_code& e) { return socket.read_some(b, e); });
    }
    template <class Buffers> std::size_t read_some(const Buffers& b) {
        error_code ec;
        return or_throw(read_some(b, ec), ec);
    }
    template <class Buffers> std::size_t write_some(const Buffers& b, error_code& ec) {
        return retry(POLLOUT, ec, [&](error_code& e) { return socket.write_some(b, e); });
    }
    template <class Buffers> std::size_t write_some(const Buffers& b) {
        error_code ec;
        return or_throw(write_some(b, ec), ec);
    }
    static std::size_t or_throw(std::size_t n, const error_code& ec) {
        if (ec) throw boost::system::system_error(ec);
        return n;
    }
};

int decode_wait_status(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

// The child's exit code once it has exited, or nullopt when the deadline passes first.
std::optional<int> wait_exit(pid_t pid, steady::time_point deadline) {
    for (;;) {
        int status = 0;
        pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return decode_wait_status(status);
        if (r < 0 && errno != EINTR) return -1;
        if (steady::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(5ms);
    }
}

int kill_and_reap(pid_t pid) {
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return decode_wait_status(status);
}

std::string read_text_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string tail(const std::string& s, std::size_t n = 4000) {
    return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

// The null-terminated char* array execve wants; points into `v`.
std::vector<char*> c_strings(std::vector<std::string>& v) {
    std::vector<char*> out;
    for (auto& s : v)
        out.push_back(s.data());
    out.push_back(nullptr);
    return out;
}

struct child {
    pid_t pid = -1;
    int out_fd = -1; // the read end of the child's stdout
};

// fork + exec of `baton args...`: stdout into a pipe; stderr appended to `log_file`, or into the
// same pipe when there is none; stdin from `in_fd`, or /dev/null. The environment is ours minus
// BATON_*, so the embedded default (echo model) applies whatever the developer's shell exports.
child spawn_baton(const std::vector<std::string>& args, const fs::path* log_file, int in_fd = -1) {
    // Everything the child needs is made before fork: after it, only async-signal-safe calls.
    std::vector<std::string> arg_strings{BATON_CLI_PATH};
    arg_strings.insert(arg_strings.end(), args.begin(), args.end());
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e)
        if (!std::string_view(*e).starts_with("BATON_")) env_strings.emplace_back(*e);
    auto argv = c_strings(arg_strings), envp = c_strings(env_strings);

    int pipe_fds[2];
    BOOST_REQUIRE_MESSAGE(::pipe2(pipe_fds, O_CLOEXEC) == 0, "pipe2: " << std::strerror(errno));
    int log_fd = pipe_fds[1];
    if (log_file) {
        log_fd = ::open(log_file->c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        BOOST_REQUIRE_MESSAGE(log_fd >= 0, "open " << *log_file << ": " << std::strerror(errno));
    }
    int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(in_fd >= 0 ? in_fd : null_fd, 0);
        ::dup2(pipe_fds[1], 1);
        ::dup2(log_fd, 2);
        sigset_t none;
        ::sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGTERM, SIG_DFL);
        ::signal(SIGINT, SIG_DFL);
        ::signal(SIGPIPE, SIG_DFL);
        // A test runner that dies without running destructors must not leave a daemon behind.
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(127);
        ::closefrom(3);
        ::execve(argv[0], argv.data(), envp.data());
        ::_exit(127);
    }
    int fork_errno = errno;
    ::close(pipe_fds[1]);
    if (log_file) ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    if (pid < 0) {
        ::close(pipe_fds[0]);
        BOOST_FAIL("fork: " << std::strerror(fork_errno));
    }
    return {pid, pipe_fds[0]};
}

} // namespace

std::optional<std::string> http_response::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (iequals(k, name)) return v;
    return std::nullopt;
}

scratch_dir::scratch_dir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    root = fs::temp_directory_path() / ("baton-e2e-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(rd()) + "-" + std::to_string(counter++));
    fs::create_directories(root);
}

scratch_dir::~scratch_dir() {
    std::error_code ec;
    fs::remove_all(root, ec);
}

std::string format_request(std::string_view method, std::string_view target, std::string_view body,
                           const header_list& headers) {
    std::string out;
    out.append(method).append(" ").append(target).append(" HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    bool has_type = false, has_length = false;
    for (const auto& [k, v] : headers) {
        out.append(k).append(": ").append(v).append("\r\n");
        has_type = has_type || iequals(k, "Content-Type");
        has_length = has_length || iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding");
    }
    if (!body.empty() || method == "POST") {
        if (!has_type) out.append("Content-Type: application/json\r\n");
        if (!has_length)
            out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
    }
    out.append("\r\n").append(body);
    return out;
}

struct connection::impl {
    asio::io_context ctx; // never run: the socket is only used synchronously, through deadlines
    tcp::socket socket{ctx};
    beast::flat_buffer buffer;
    std::chrono::milliseconds timeout;
    std::string error;

    deadline_stream stream() { return {socket, steady::now() + timeout}; }
};

connection::connection(const std::string& host, unsigned short port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
    impl_->timeout = timeout;
    error_code ec;
    tcp::endpoint ep(asio::ip::make_address(host, ec), port);
    BOOST_REQUIRE_MESSAGE(!ec, "bad address " << host);
    impl_->socket.open(ep.protocol());
    impl_->socket.non_blocking(true);
    // Asio's own connect would wait without a bound once it is in progress.
    int fd = impl_->socket.native_handle();
    auto deadline = steady::now() + timeout;
    if (::connect(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
        BOOST_REQUIRE_MESSAGE(errno == EINPROGRESS, "connect: " << std::strerror(errno));
        BOOST_REQUIRE_MESSAGE(poll_until(fd, POLLOUT, deadline), "connect: timed out");
        int so_error = 0;
        socklen_t len = sizeof so_error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        BOOST_REQUIRE_MESSAGE(so_error == 0, "connect: " << std::strerror(so_error));
    }
}

connection::~connection() = default;
connection::connection(connection&&) noexcept = default;
connection& connection::operator=(connection&&) noexcept = default;

bool connection::write(std::string_view bytes) {
    auto s = impl_->stream();
    error_code ec;
    while (!bytes.empty()) {
        std::size_t n = s.write_some(asio::buffer(bytes.data(), bytes.size()), ec);
        if (ec) {
            impl_->error = "write: " + ec.message();
            return false;
        }
        bytes.remove_prefix(n);
    }
    return true;
}

std::optional<http_response> connection::read_response(bool head) {
    bhttp::response_parser<bhttp::string_body> parser;
    parser.skip(head);
    parser.header_limit(64 * 1024);
    parser.body_limit(64 * 1024 * 1024);
    auto s = impl_->stream();
    error_code ec;
    bhttp::read(s, impl_->buffer, parser, ec);
    if (ec) {
        impl_->error = "read: " + ec.message();
        return std::nullopt;
    }
    const auto& res = parser.get();
    http_response r;
    r.status = res.result_int();
    for (const auto& f : res)
        r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = res.body();
    r.keep_alive = res.keep_alive();
    error_code jec;
    auto v = json::parse(r.body, jec);
    if (!jec) r.json = std::move(v);
    return r;
}

http_response connection::request(std::string_view method, std::string_view target,
                                  std::string_view body, const header_list& headers) {
    BOOST_REQUIRE_MESSAGE(write(format_request(method, target, body, headers)),
                          method << " " << target << ": " << impl_->error);
    auto r = read_response(method == "HEAD");
    BOOST_REQUIRE_MESSAGE(r.has_value(), method << " " << target << ": no response, " << impl_->error);
    return std::move(*r);
}

connection::drained connection::read_until_close() {
    drained d{beast::buffers_to_string(impl_->buffer.data()), false};
    impl_->buffer.consume(impl_->buffer.size());
    auto s = impl_->stream();
    char chunk[4096];
    for (;;) {
        error_code ec;
        std::size_t n = s.read_some(asio::buffer(chunk), ec);
        d.bytes.append(chunk, n);
        if (ec == asio::error::eof || ec == asio::error::connection_reset) {
            d.closed = true;
            return d;
        }
        if (ec) {
            impl_->error = "read: " + ec.message();
            return d;
        }
    }
}

std::string connection::read_until_seen(const std::vector<std::string>& needles) {
    std::string bytes = beast::buffers_to_string(impl_->buffer.data());
    impl_->buffer.consume(impl_->buffer.size());
    auto s = impl_->stream();
    auto all_seen = [&] {
        return std::all_of(needles.begin(), needles.end(),
                           [&](const std::string& n) { return bytes.find(n) != std::string::npos; });
    };
    char chunk[4096];
    while (!all_seen()) {
        error_code ec;
        std::size_t n = s.read_some(asio::buffer(chunk), ec);
        bytes.append(chunk, n);
        if (ec) {
            impl_->error = "read: " + ec.message();
            break;
        }
    }
    return bytes;
}

std::string connection::last_error() const {
    return impl_->error;
}

daemon_process::daemon_process(const std::vector<std::string>& args, const fs::path& log_file,
                               std::chrono::milliseconds startup_limit) {
    auto c = spawn_baton(args, &log_file);
    pid_ = c.pid;
    stdout_fd_ = c.out_fd;
    constexpr std::string_view plain = "listening on http://", tls = "listening on https://";
    auto deadline = steady::now() + startup_limit;
    std::string out, problem;
    while (problem.empty()) {
        if (auto nl = out.find('\n'); nl != std::string::npos) {
            std::string line = out.substr(0, nl);
            out.erase(0, nl + 1);
            if (!line.starts_with(plain) && !line.starts_with(tls)) continue;
            tls_ = line.starts_with(tls);
            std::string hostport = line.substr(tls_ ? tls.size() : plain.size());
            auto colon = hostport.rfind(':');
            host_ = hostport.substr(0, colon);
            if (host_.size() > 2 && host_.front() == '[') host_ = host_.substr(1, host_.size() - 2);
            if (colon != std::string::npos)
                port_ = static_cast<unsigned short>(std::atoi(&hostport[colon + 1]));
            if (port_ != 0) return;
            problem = "cannot parse: " + line;
            break;
        }
        if (!poll_until(stdout_fd_, POLLIN, deadline)) {
            problem = "no `listening on` line within " + std::to_string(startup_limit.count()) + " ms";
            break;
        }
        char chunk[512];
        ssize_t n = ::read(stdout_fd_, chunk, sizeof chunk);
        if (n == 0) problem = "the daemon exited before listening; stdout: " + out;
        if (n > 0) out.append(chunk, static_cast<std::size_t>(n));
        if (n < 0 && errno != EINTR) problem = std::string("read: ") + std::strerror(errno);
    }
    // The destructor does not run for a constructor that fails: clean up here.
    int code = stop(2s);
    BOOST_FAIL("baton " << args.front() << ": " << problem << " (exit code " << code << ")\nstderr:\n"
                        << tail(read_text_file(log_file)));
}

daemon_process::~daemon_process() {
    stop();
}

int daemon_process::stop(std::chrono::milliseconds grace) {
    if (pid_ > 0) {
        std::optional<int> code;
        if (grace.count() > 0) {
            ::kill(pid_, SIGTERM);
            code = wait_exit(pid_, steady::now() + grace);
        }
        exit_code_ = code ? *code : kill_and_reap(pid_);
        pid_ = -1;
    }
    if (stdout_fd_ >= 0) {
        ::close(stdout_fd_);
        stdout_fd_ = -1;
    }
    return exit_code_;
}

cli_process::cli_process(const std::vector<std::string>& args) {
    // A child that exits before reading all its input must fail the test, not kill it.
    ::signal(SIGPIPE, SIG_IGN);
    int in[2];
    BOOST_REQUIRE_MESSAGE(::pipe2(in, O_CLOEXEC) == 0, "pipe2: " << std::strerror(errno));
    auto c = spawn_baton(args, nullptr, in[0]);
    ::close(in[0]);
    pid_ = c.pid;
    out_fd_ = c.out_fd;
    in_fd_ = in[1];
}

cli_process::~cli_process() {
    close_stdin();
    if (pid_ > 0) kill_and_reap(pid_);
    if (out_fd_ >= 0) ::close(out_fd_);
}

bool cli_process::write(std::string_view text) {
    while (!text.empty() && in_fd_ >= 0) {
        ssize_t n = ::write(in_fd_, text.data(), text.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        text.remove_prefix(static_cast<std::size_t>(n));
    }
    return text.empty();
}

void cli_process::close_stdin() {
    if (in_fd_ >= 0) ::close(in_fd_);
    in_fd_ = -1;
}

bool cli_process::read_some(steady::time_point deadline) {
    if (out_fd_ < 0 || !poll_until(out_fd_, POLLIN, deadline)) return false;
    char chunk[4096];
    ssize_t n = ::read(out_fd_, chunk, sizeof chunk);
    if (n > 0) output_.append(chunk, static_cast<std::size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) {
        ::close(out_fd_);
        out_fd_ = -1;
    }
    return n != 0;
}

bool cli_process::wait_for(std::string_view needle, std::chrono::milliseconds limit) {
    auto deadline = steady::now() + limit;
    while (output_.find(needle) == std::string::npos)
        if (!read_some(deadline)) return output_.find(needle) != std::string::npos;
    return true;
}

void cli_process::signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
}

int cli_process::wait(std::chrono::milliseconds limit) {
    close_stdin();
    auto deadline = steady::now() + limit;
    while (out_fd_ >= 0 && read_some(deadline)) {
    }
    if (pid_ > 0) {
        auto code = wait_exit(pid_, deadline);
        if (!code) {
            kill_and_reap(pid_);
            pid_ = -1;
            BOOST_FAIL("baton did not finish within " << limit.count() << " ms; output:\n" << output_);
        }
        exit_code_ = *code;
        pid_ = -1;
    }
    return exit_code_;
}

cli_result run_baton(const std::vector<std::string>& args, std::string_view input,
                     std::chrono::milliseconds limit) {
    cli_process p(args);
    BOOST_TEST(p.write(input), "baton stopped reading its input; output:\n" << p.output());
    int code = p.wait(limit);
    return {code, p.output()};
}

cli_result run_baton(const std::vector<std::string>& args, std::chrono::milliseconds limit) {
    auto c = spawn_baton(args, nullptr);
    auto deadline = steady::now() + limit;
    cli_result r;
    for (;;) {
        if (!poll_until(c.out_fd, POLLIN, deadline)) break;
        char chunk[4096];
        ssize_t n = ::read(c.out_fd, chunk, sizeof chunk);
        if (n > 0) r.output.append(chunk, static_cast<std::size_t>(n));
        if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    ::close(c.out_fd);
    auto code = wait_exit(c.pid, deadline);
    if (!code) {
        kill_and_reap(c.pid);
        BOOST_FAIL("baton did not finish within " << limit.count() << " ms; output:\n" << r.output);
    }
    r.exit_code = *code;
    return r;
}

const std::vector<std::string>& terminal_statuses() {
    static const std::vector<std::string> s{"completed", "stopped", "failed", "timed_out", "step_limit"};
    return s;
}

daemon_fixture::daemon_fixture() {
    start();
}

daemon_fixture::daemon_fixture(deferred) {}

daemon_fixture::~daemon_fixture() {
    if (daemon) daemon->stop();
    // A failed test shows what the daemon said.
    namespace ut = boost::unit_test;
    auto id = ut::framework::current_test_case().p_id;
    if (!ut::results_collector.results(id).passed())
        BOOST_TEST_MESSAGE("daemon stderr:\n" << tail(log()));
}

void daemon_fixture::start(const std::vector<std::string>& extra_args) {
    BOOST_REQUIRE_MESSAGE(!daemon, "the daemon is already running");
    std::vector<std::string> args{"serve", "--listen", "127.0.0.1:0", "--data", data_dir().string()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    daemon = std::make_unique<daemon_process>(args, dir.root / "daemon.log");
}

int daemon_fixture::stop(std::chrono::milliseconds grace) {
    BOOST_REQUIRE_MESSAGE(daemon, "the daemon is not running");
    int code = daemon->stop(grace);
    daemon.reset();
    return code;
}

void write_text_file(const fs::path& p, std::string_view content) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    BOOST_REQUIRE_MESSAGE(!out.fail(), "cannot write " << p);
}

fs::path daemon_fixture::write_file(const std::string& name, std::string_view content) const {
    auto p = dir.root / name;
    write_text_file(p, content);
    return p;
}

std::string daemon_fixture::log() const {
    return read_text_file(dir.root / "daemon.log");
}

http_response daemon_fixture::post_message(std::string_view sid, std::string_view text,
                                           const header_list& headers) const {
    json::object body{{"text", text}};
    return request("POST", "/v1/sessions/" + std::string(sid) + "/messages", json::serialize(body),
                   headers);
}

json::object daemon_fixture::wait_for_turn(std::string_view tid, const std::vector<std::string>& until,
                                           std::chrono::milliseconds limit) const {
    return wait_for_turn(tid, header_list{}, until, limit);
}

json::object daemon_fixture::wait_for_turn(std::string_view tid, const header_list& headers,
                                           const std::vector<std::string>& until,
                                           std::chrono::milliseconds limit) const {
    const std::string target = "/v1/turns/" + std::string(tid);
    auto deadline = steady::now() + limit;
    http_response last;
    for (;;) {
        last = request("GET", target, {}, headers);
        if (const auto* rec = last.json.if_object(); rec && last.status == 200) {
            const auto* status = rec->if_contains("status");
            if (status && status->is_string() &&
                std::find(until.begin(), until.end(), status->get_string()) != until.end())
                return *rec;
        }
        if (steady::now() >= deadline) break;
        std::this_thread::sleep_for(10ms);
    }
    BOOST_FAIL("turn " << tid << " did not reach the expected status within " << limit.count()
                       << " ms; last answer: " << last.status << " " << last.body);
    return {};
}

issued new_token(const std::vector<std::string>& args) {
    std::vector<std::string> all{"token", "new"};
    all.insert(all.end(), args.begin(), args.end());
    auto r = run_baton(all);
    BOOST_TEST_REQUIRE(r.exit_code == 0, r.output);
    auto nl = r.output.find('\n');
    BOOST_TEST_REQUIRE(nl != std::string::npos);
    issued out{r.output.substr(0, nl), r.output.substr(nl + 1)};
    while (!out.entry.empty() && out.entry.back() == '\n')
        out.entry.pop_back();
    auto entry = json::parse(out.entry).as_object();
    BOOST_TEST(entry.at("sha256").as_string() == sha256_hex(out.token));
    BOOST_TEST(out.entry.find(out.token) == std::string::npos); // only the hash goes in the config
    return out;
}

} // namespace baton::test
