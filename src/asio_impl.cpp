// Asio and Beast are compiled once, here (BOOST_*_SEPARATE_COMPILATION), to keep builds lean.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
