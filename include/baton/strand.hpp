// A strand for an executor that is usually an io_context's, handed over as any_io_executor.
//
// strand<any_io_executor> is too big for any_io_executor's inline storage, so every copy of a
// coroutine's executor, every prefer() on it (each async operation makes a few) and every
// execute through the strand allocated: ~190 allocations a turn in the daemon. A strand over
// the io_context's own executor is three words and fits inline, so none of that allocates. Any
// other executor (an embedder's own) still gets a strand over it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

namespace baton::detail {

inline boost::asio::any_io_executor make_thin_strand(const boost::asio::any_io_executor& ex) {
    namespace asio = boost::asio;
    using plain = asio::io_context::executor_type;
    using tracked = asio::io_context::basic_executor_type<std::allocator<void>, 4>;
    if (const auto* io = ex.target<plain>()) return asio::make_strand(*io);
    if (const auto* io = ex.target<tracked>()) return asio::make_strand(*io);
    return asio::make_strand(ex);
}

} // namespace baton::detail
