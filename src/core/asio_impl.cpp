// Asio is compiled once, here (BOOST_ASIO_SEPARATE_COMPILATION), to keep builds lean. The macro is
// private to baton's own targets: a program that embeds baton uses Asio header-only, as usual.
#include <boost/asio/impl/src.hpp>
