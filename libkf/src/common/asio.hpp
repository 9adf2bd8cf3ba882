// SPDX-License-Identifier: Apache-2.0
// The Asio names libkf's private code uses: its sockets, coroutines and the generic stream
// that carries both TCP and Unix-domain connections. Private: Asio stays out of public headers.
#pragma once

#include <boost/asio.hpp>

namespace kf::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using local_stream = asio::local::stream_protocol;
/// A connection's socket: TCP, or a Unix-domain socket to a worker on this host.
using Stream = asio::generic::stream_protocol::socket;
template <typename T>
using awaitable = asio::awaitable<T>;

}  // namespace kf::detail
