#include "bench/process.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace baton::bench {

namespace fs = std::filesystem;

temp_dir::temp_dir(const std::string& prefix) {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    path = tmpl;
}
temp_dir::~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
}

int child_process::stop() {
    if (pid > 0) {
        kill(pid, SIGTERM);
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        pid_t r = 0;
        while ((r = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (r == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
        }
        pid = -1;
    }
    if (out >= 0) close(out);
    out = -1;
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string child_process::start(const std::vector<std::string>& args, const fs::path& log) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "BATON_MODEL", 11) != 0) envp.push_back(*e);
    envp.push_back(nullptr);
    int rc = posix_spawn(&pid, copy[0].c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out = fds[0];
    if (rc != 0) {
        pid = -1;
        throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(rc));
    }
    std::string line;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos) {
        auto left = std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
        pollfd p{out, POLLIN, 0};
        if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
            throw std::runtime_error(
                args[0] + " did not print its address within 20 s (log: " + log.string() + ")");
        char buf[256];
        auto n = read(out, buf, sizeof buf);
        if (n <= 0)
            throw std::runtime_error(args[0] + " exited before listening (log: " + log.string() + ")");
        line.append(buf, static_cast<std::size_t>(n));
    }
    return line.substr(0, line.find('\n'));
}

std::string self_path() {
    std::error_code ec;
    auto self = fs::read_symlink("/proc/self/exe", ec);
    return ec ? "baton-bench" : self.string();
}

std::string default_baton_path() {
    std::error_code ec;
    auto self = fs::read_symlink("/proc/self/exe", ec);
    return ec ? "baton" : (self.parent_path() / "baton").string();
}

http_url listening_url(const std::string& line) {
    constexpr std::string_view prefix = "listening on ";
    auto url = line.starts_with(prefix) ? parse_http_url(line.substr(prefix.size())) : std::nullopt;
    if (!url) throw std::runtime_error("unexpected first line: " + line);
    return *url;
}

asio::awaitable<bool> wait_healthy(http_connection& c) {
    constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
    asio::steady_timer t(co_await asio::this_coro::executor);
    for (int i = 0; i < 200; ++i) {
        auto [ec, r] = co_await c.request(method_get, "/healthz", {}, milliseconds(2000));
        if (!ec && r.status == 200) co_return true;
        t.expires_after(milliseconds(50));
        co_await t.async_wait(use_tuple);
    }
    co_return false;
}

} // namespace baton::bench
