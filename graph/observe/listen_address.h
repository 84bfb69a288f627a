// Where the live server listens (graph/observe/http_server.h): parsed from `--serve` and
// [logging] http, in the torch-free and server-free part of the engine so that a config can be
// checked without either.
#pragma once

#include <string>

namespace pipeline::graph {

/// Where to listen: "PORT", "ADDR:PORT" or "[IPv6]:PORT". Without an address, 127.0.0.1.
struct ListenAddress {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  /// Whether only this machine can reach it (127.0.0.0/8, ::1).
  bool loopback() const;
  /// "127.0.0.1:8080", "[::1]:8080".
  std::string str() const;
};
/// Parses an address as given to --serve or [logging] http; throws std::invalid_argument saying
/// what was expected and what was found.
ListenAddress parse_listen_address(const std::string& text);

}  // namespace pipeline::graph
