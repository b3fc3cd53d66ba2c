// The PostgreSQL test cluster that scripts/test starts (scripts/pg-cluster): BATON_TEST_PG is its
// conninfo, BATON_TEST_PG_DIR its directory. Without them the PostgreSQL cases are skipped.
#pragma once

#include "src/store/pq.hpp"

#include <atomic>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

namespace baton::test {

inline std::string test_pg() {
    const char* v = std::getenv("BATON_TEST_PG");
    return v ? v : "";
}

inline std::string test_pg_dir() {
    const char* v = std::getenv("BATON_TEST_PG_DIR");
    return v ? v : "";
}

// Runs SQL on the test cluster with libpq's blocking calls (test setup only).
inline void pg_exec(const std::string& conninfo, const std::string& sql) {
    const auto& pq = detail::pq();
    PGconn* c = pq.PQconnectdb(conninfo.c_str());
    std::string error;
    if (pq.PQstatus(c) != CONNECTION_OK) {
        error = pq.PQerrorMessage(c);
    } else {
        PGresult* r = pq.PQexec(c, sql.c_str());
        auto st = pq.PQresultStatus(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) error = pq.PQresultErrorMessage(r);
        pq.PQclear(r);
    }
    pq.PQfinish(c);
    if (!error.empty()) throw std::runtime_error("test cluster: " + sql + ": " + error);
}

// A schema of its own in the test cluster, so that every case starts empty; dropped at the end.
struct pg_schema {
    std::string name;
    pg_schema() {
        static std::atomic<int> counter{0};
        std::random_device rd;
        name = "t" + std::to_string(rd() % 100000000) + "_" + std::to_string(counter++);
        pg_exec(test_pg(), "CREATE SCHEMA " + name);
    }
    ~pg_schema() {
        try {
            pg_exec(test_pg(), "SET client_min_messages = warning; DROP SCHEMA " + name + " CASCADE");
        } catch (const std::exception&) {
        }
    }
    pg_schema(const pg_schema&) = delete;
    pg_schema& operator=(const pg_schema&) = delete;
    // The cluster's conninfo with this schema first on the search_path.
    std::string conninfo() const { return test_pg() + " options='-csearch_path=" + name + "'"; }
};

} // namespace baton::test
