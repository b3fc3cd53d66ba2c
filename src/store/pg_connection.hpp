// One PostgreSQL connection driven by libpq in non-blocking mode on an Asio event loop: its socket
// is watched with posix::stream_descriptor, and queries go out in pipeline mode, several per round
// trip. Every member is called on the loop's thread (the PostgreSQL store's own).
#pragma once

#include "src/store/pq.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::detail {

// A failure the database reported, or a lost connection. `sqlstate` is PostgreSQL's code
// ("23505" for a unique violation), empty when the connection failed; `constraint` the violated
// constraint's name when there is one.
class pg_error : public std::runtime_error {
public:
    pg_error(const std::string& what, std::string sqlstate, std::string constraint)
        : std::runtime_error(what), sqlstate_(std::move(sqlstate)), constraint_(std::move(constraint)) {}
    const std::string& sqlstate() const { return sqlstate_; }
    const std::string& constraint() const { return constraint_; }
    bool connection_lost() const { return sqlstate_.empty() || sqlstate_.starts_with("08"); }

private:
    std::string sqlstate_, constraint_;
};

// One statement of a pipeline: a prepared one (by its index in the store's table of statements,
// prepared on each connection at first use) or, with `stmt` < 0, the text in `sql`.
struct pg_query {
    int stmt = -1;
    std::string sql;
    std::vector<std::optional<std::string>> params; // text format; nullopt is NULL
};

// A query's result: rows of text values.
class pg_result {
public:
    explicit pg_result(result_ptr r) : r_(std::move(r)) {}
    int rows() const;
    bool is_null(int row, int col) const;
    std::string text(int row, int col) const;
    std::optional<std::string> opt_text(int row, int col) const;
    std::int64_t int64(int row, int col) const;
    std::optional<std::int64_t> opt_int64(int row, int col) const;
    std::int64_t affected() const; // rows an INSERT, UPDATE or DELETE changed

private:
    result_ptr r_;
};

struct pg_statement_table {
    std::vector<std::string> sql; // index = pg_query::stmt
};

class pg_connection {
public:
    pg_connection(boost::asio::any_io_executor ex, const pg_statement_table& statements);
    ~pg_connection();
    pg_connection(const pg_connection&) = delete;
    pg_connection& operator=(const pg_connection&) = delete;

    // Connects (conninfo: a libpq keyword string or URI), within `timeout`; throws pg_error.
    boost::asio::awaitable<void> connect(const std::string& conninfo, std::chrono::milliseconds timeout);

    // Sends `queries` as one pipeline and returns their results in order, within `timeout`. When a
    // query fails, the server skips the rest; this throws that query's pg_error, and the
    // connection stays usable if ok(). A timeout or a lost connection leaves it closed.
    boost::asio::awaitable<std::vector<pg_result>> exec(std::vector<pg_query>& queries,
                                                        std::chrono::milliseconds timeout);

    bool ok() const;
    // PQTRANS_IDLE, INTRANS or INERROR once exec has returned.
    PGTransactionStatusType transaction_status() const;

    // Notifications received (LISTEN), oldest first, taken from the connection.
    std::vector<std::pair<std::string, std::string>> take_notifications();

    // Waits until the server sends something (a notification) or `timeout` passes; false on a
    // lost connection.
    boost::asio::awaitable<bool> wait_input(std::chrono::milliseconds timeout);

private:
    boost::asio::awaitable<void> wait(boost::asio::posix::stream_descriptor::wait_type w);
    boost::asio::awaitable<void> flush();
    boost::asio::awaitable<result_ptr> next_result();
    void watch_socket();
    void close();
    void arm(std::chrono::milliseconds timeout);
    void disarm();
    [[noreturn]] void fail_connection(const std::string& what);

    const pg_statement_table& statements_;
    PGconn* conn_ = nullptr;
    boost::asio::posix::stream_descriptor socket_;
    boost::asio::steady_timer deadline_;
    bool timed_out_ = false;
    // The deadline armed last: a deadline that fired just as its operation finished (its handler
    // queued, past cancelling) finds a later number here and touches nothing.
    std::shared_ptr<std::uint64_t> armed_ = std::make_shared<std::uint64_t>(0);
    std::vector<bool> prepared_;
};

} // namespace baton::detail
