// Beast is compiled once, here (BOOST_BEAST_SEPARATE_COMPILATION, private to baton's targets).
#include <boost/beast/src.hpp>
