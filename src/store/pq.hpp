// libpq, loaded when a PostgreSQL store is first opened (dlopen of libpq.so.5), so that a daemon on
// SQLite maps none of libpq's two dozen libraries (Kerberos, LDAP, GnuTLS...) and stays within its
// idle memory. Only the declarations of libpq-fe.h are compiled in. The blocking calls (PQconnectdb,
// PQexec) are for tests and tools, never for a store.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>

namespace baton::detail {

struct pq_api {
#define BATON_PQ_FUNCTIONS(X)                                                                           \
    X(PQconnectStartParams)                                                                             \
    X(PQconnectPoll)                                                                                    \
    X(PQstatus)                                                                                         \
    X(PQerrorMessage)                                                                                   \
    X(PQsocket)                                                                                         \
    X(PQsetnonblocking)                                                                                 \
    X(PQfinish)                                                                                         \
    X(PQenterPipelineMode)                                                                              \
    X(PQpipelineSync)                                                                                   \
    X(PQsendQueryParams)                                                                                \
    X(PQsendPrepare)                                                                                    \
    X(PQsendQueryPrepared)                                                                              \
    X(PQflush)                                                                                          \
    X(PQconsumeInput)                                                                                   \
    X(PQisBusy)                                                                                         \
    X(PQgetResult)                                                                                      \
    X(PQresultStatus)                                                                                   \
    X(PQresultErrorMessage)                                                                             \
    X(PQresultErrorField)                                                                               \
    X(PQclear)                                                                                          \
    X(PQntuples)                                                                                        \
    X(PQgetvalue)                                                                                       \
    X(PQgetisnull)                                                                                      \
    X(PQgetlength)                                                                                      \
    X(PQcmdTuples)                                                                                      \
    X(PQtransactionStatus)                                                                              \
    X(PQnotifies)                                                                                       \
    X(PQfreemem)                                                                                        \
    X(PQsetNoticeProcessor)                                                                             \
    X(PQconnectdb)                                                                                      \
    X(PQconninfoParse)                                                                                  \
    X(PQconninfoFree)                                                                                   \
    X(PQexec)
#define BATON_PQ_MEMBER(name) decltype(&::name) name = nullptr;
    BATON_PQ_FUNCTIONS(BATON_PQ_MEMBER)
#undef BATON_PQ_MEMBER
};

// The loaded library (once per process; never unloaded). Throws std::runtime_error naming the
// library when it cannot be loaded (Debian: libpq5).
const pq_api& pq();

struct result_deleter {
    void operator()(PGresult* r) const { pq().PQclear(r); }
};
using result_ptr = std::unique_ptr<PGresult, result_deleter>;

} // namespace baton::detail
