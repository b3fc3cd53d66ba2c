#include "src/store/pg_connection.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <charconv>

namespace baton::detail {
namespace asio = boost::asio;
using wait_type = asio::posix::stream_descriptor::wait_type;

namespace {

std::string trimmed(const char* s) {
    std::string out = s ? s : "";
    while (!out.empty() && (out.back() == '\n' || out.back() == ' '))
        out.pop_back();
    return out;
}

std::string field(const PGresult* r, int code) {
    const char* v = pq().PQresultErrorField(r, code);
    return v ? v : "";
}

std::string statement_name(int index) {
    return "baton_" + std::to_string(index);
}

} // namespace

int pg_result::rows() const {
    return pq().PQntuples(r_.get());
}

bool pg_result::is_null(int row, int col) const {
    return pq().PQgetisnull(r_.get(), row, col) != 0;
}

std::string pg_result::text(int row, int col) const {
    return std::string(pq().PQgetvalue(r_.get(), row, col),
                       static_cast<std::size_t>(pq().PQgetlength(r_.get(), row, col)));
}

std::optional<std::string> pg_result::opt_text(int row, int col) const {
    if (is_null(row, col)) return std::nullopt;
    return text(row, col);
}

std::int64_t pg_result::int64(int row, int col) const {
    if (is_null(row, col)) return 0;
    const char* v = pq().PQgetvalue(r_.get(), row, col);
    const char* end = v + pq().PQgetlength(r_.get(), row, col);
    std::int64_t out = 0;
    auto [p, ec] = std::from_chars(v, end, out);
    if (ec != std::errc{} || p != end)
        throw std::runtime_error("postgres: not an integer: '" + std::string(v, end) + "'");
    return out;
}

std::optional<std::int64_t> pg_result::opt_int64(int row, int col) const {
    if (is_null(row, col)) return std::nullopt;
    return int64(row, col);
}

std::int64_t pg_result::affected() const {
    const char* n = pq().PQcmdTuples(r_.get());
    std::int64_t out = 0;
    if (n && *n) std::from_chars(n, n + std::char_traits<char>::length(n), out);
    return out;
}

pg_connection::pg_connection(asio::any_io_executor ex, const pg_statement_table& statements)
    : statements_(statements), socket_(ex), deadline_(ex), prepared_(statements.sql.size(), false) {}

pg_connection::~pg_connection() {
    disarm();
    close();
}

void pg_connection::close() {
    // libpq owns the socket: the descriptor only watches it, and must let go before PQfinish.
    if (socket_.is_open()) socket_.release();
    if (conn_) pq().PQfinish(conn_);
    conn_ = nullptr;
}

void pg_connection::fail_connection(const std::string& what) {
    std::string why = conn_ ? trimmed(pq().PQerrorMessage(conn_)) : std::string();
    close();
    throw pg_error("postgres: " + what + (why.empty() ? "" : ": " + why), "", "");
}

bool pg_connection::ok() const {
    return conn_ && pq().PQstatus(conn_) == CONNECTION_OK;
}

PGTransactionStatusType pg_connection::transaction_status() const {
    return conn_ ? pq().PQtransactionStatus(conn_) : PQTRANS_UNKNOWN;
}

void pg_connection::arm(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    deadline_.expires_after(timeout);
    // Touches `this` only when this very deadline passed: a cancelled wait may complete after the
    // connection is gone, and one that fired as its operation finished, during a later one.
    deadline_.async_wait([this, armed = armed_, mine = ++*armed_](boost::system::error_code ec) {
        if (ec || *armed != mine) return;
        timed_out_ = true;
        boost::system::error_code ignored;
        socket_.cancel(ignored);
    });
}

void pg_connection::disarm() {
    ++*armed_;
    deadline_.cancel();
}

void pg_connection::watch_socket() {
    // Re-assigned after every step of a connect: libpq may close its socket and open another,
    // which can come back under the same number with no epoll registration left.
    if (socket_.is_open()) socket_.release();
    int fd = pq().PQsocket(conn_);
    if (fd >= 0) socket_.assign(fd);
}

asio::awaitable<void> pg_connection::wait(wait_type w) {
    boost::system::error_code ec;
    co_await socket_.async_wait(w, asio::redirect_error(asio::use_awaitable, ec));
    if (timed_out_) fail_connection("no answer in time (the connection is closed)");
    if (ec) fail_connection("waiting on the socket: " + ec.message());
}

asio::awaitable<void> pg_connection::connect(const std::string& conninfo,
                                             std::chrono::milliseconds timeout) {
    // The conninfo is expanded in place of dbname; the encoding cannot be overridden by it.
    const char* keys[] = {"dbname", "fallback_application_name", "client_encoding", nullptr};
    const char* values[] = {conninfo.c_str(), "baton", "UTF8", nullptr};
    conn_ = pq().PQconnectStartParams(keys, values, 1);
    if (!conn_) throw pg_error("postgres: cannot connect: out of memory", "", "");
    // The server's notices (a CREATE ... IF NOT EXISTS that skips) are not the daemon's output:
    // libpq would print them on stderr.
    pq().PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);
    if (pq().PQstatus(conn_) == CONNECTION_BAD) fail_connection("cannot connect");
    arm(timeout);
    auto st = PGRES_POLLING_WRITING;
    while (st != PGRES_POLLING_OK) {
        if (st == PGRES_POLLING_FAILED) fail_connection("cannot connect");
        watch_socket();
        if (!socket_.is_open()) fail_connection("cannot connect");
        co_await wait(st == PGRES_POLLING_READING ? wait_type::wait_read : wait_type::wait_write);
        st = pq().PQconnectPoll(conn_);
    }
    disarm();
    watch_socket();
    if (pq().PQsetnonblocking(conn_, 1) != 0) fail_connection("cannot make the connection non-blocking");
    if (pq().PQenterPipelineMode(conn_) != 1) fail_connection("cannot enter pipeline mode");
}

asio::awaitable<void> pg_connection::flush() {
    for (;;) {
        int r = pq().PQflush(conn_);
        if (r == 0) co_return;
        if (r < 0) fail_connection("sending");
        co_await wait(wait_type::wait_write);
        // Read what the server sent meanwhile, so that neither side waits on a full buffer.
        if (pq().PQconsumeInput(conn_) == 0) fail_connection("connection lost");
    }
}

asio::awaitable<result_ptr> pg_connection::next_result() {
    while (pq().PQisBusy(conn_)) {
        co_await wait(wait_type::wait_read);
        if (pq().PQconsumeInput(conn_) == 0) fail_connection("connection lost");
    }
    co_return result_ptr(pq().PQgetResult(conn_));
}

asio::awaitable<std::vector<pg_result>> pg_connection::exec(std::vector<pg_query>& queries,
                                                            std::chrono::milliseconds timeout) {
    if (!ok()) fail_connection("connection lost");
    // What each pipeline entry is: a query (its index in `queries`) or a prepare (-1 - stmt).
    std::vector<int> entries;
    entries.reserve(queries.size() * 2);
    std::vector<const char*> values;
    for (std::size_t i = 0; i < queries.size(); ++i) {
        auto& q = queries[i];
        values.clear();
        for (auto& p : q.params)
            values.push_back(p ? p->c_str() : nullptr);
        int n = static_cast<int>(values.size());
        int sent = 0;
        if (q.stmt >= 0) {
            auto name = statement_name(q.stmt);
            if (!prepared_[static_cast<std::size_t>(q.stmt)]) {
                if (!pq().PQsendPrepare(conn_, name.c_str(),
                                        statements_.sql[static_cast<std::size_t>(q.stmt)].c_str(), 0,
                                        nullptr))
                    fail_connection("sending a statement");
                entries.push_back(-1 - q.stmt);
                prepared_[static_cast<std::size_t>(q.stmt)] = true; // undone below if it failed
            }
            sent = pq().PQsendQueryPrepared(conn_, name.c_str(), n, values.data(), nullptr, nullptr, 0);
        } else {
            sent = pq().PQsendQueryParams(conn_, q.sql.c_str(), n, nullptr, values.data(), nullptr,
                                          nullptr, 0);
        }
        if (!sent) fail_connection("sending a query");
        entries.push_back(static_cast<int>(i));
    }
    if (!pq().PQpipelineSync(conn_)) fail_connection("sending");
    arm(timeout);
    co_await flush();
    std::vector<pg_result> out;
    out.reserve(queries.size());
    std::optional<pg_error> error;
    for (int e : entries) {
        // Each entry's results, then a null that ends them.
        result_ptr kept;
        for (;;) {
            auto r = co_await next_result();
            if (!r) break;
            auto st = pq().PQresultStatus(r.get());
            if (st == PGRES_FATAL_ERROR) {
                if (!ok()) fail_connection("connection lost");
                if (!error)
                    error.emplace("postgres: " + field(r.get(), PG_DIAG_MESSAGE_PRIMARY),
                                  field(r.get(), PG_DIAG_SQLSTATE),
                                  field(r.get(), PG_DIAG_CONSTRAINT_NAME));
                if (e < 0) prepared_[static_cast<std::size_t>(-1 - e)] = false;
            } else if (st == PGRES_PIPELINE_ABORTED) {
                if (e < 0) prepared_[static_cast<std::size_t>(-1 - e)] = false;
            } else if (st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR) {
                fail_connection("bad response");
            } else {
                kept = std::move(r);
            }
        }
        if (e >= 0 && !error) out.emplace_back(std::move(kept));
    }
    auto sync = co_await next_result();
    if (!sync || pq().PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC)
        fail_connection("the pipeline lost its place");
    disarm();
    if (error) throw *error;
    co_return out;
}

std::vector<std::pair<std::string, std::string>> pg_connection::take_notifications() {
    std::vector<std::pair<std::string, std::string>> out;
    if (!conn_) return out;
    while (PGnotify* n = pq().PQnotifies(conn_)) {
        out.emplace_back(n->relname ? n->relname : "", n->extra ? n->extra : "");
        pq().PQfreemem(n);
    }
    return out;
}

asio::awaitable<bool> pg_connection::wait_input(std::chrono::milliseconds timeout) {
    if (!ok()) co_return false;
    arm(timeout);
    boost::system::error_code ec;
    co_await socket_.async_wait(wait_type::wait_read, asio::redirect_error(asio::use_awaitable, ec));
    bool expired = timed_out_;
    disarm();
    if (expired) co_return true;
    if (ec || pq().PQconsumeInput(conn_) == 0) {
        close();
        co_return false;
    }
    co_return true;
}

} // namespace baton::detail
