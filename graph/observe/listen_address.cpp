// See listen_address.h.
#include "graph/observe/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <stdexcept>

namespace pipeline::graph {

bool ListenAddress::loopback() const {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string ListenAddress::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

ListenAddress parse_listen_address(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("'" + text + "': " + why +
                                 " (expected PORT, ADDRESS:PORT or [IPv6]:PORT, e.g. 8080 or 127.0.0.1:8080)");
  };
  ListenAddress a;
  std::string port = text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw bad("an IPv6 address in brackets must be followed by :PORT");
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, a.host.c_str(), &v6) != 1) throw bad("'" + a.host + "' is not an IPv6 address");
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (a.host == "localhost") a.host = "127.0.0.1";
    in_addr v4{};
    if (inet_pton(AF_INET, a.host.c_str(), &v4) != 1)
      throw bad("'" + a.host + "' is not an IPv4 address (host names other than localhost are not looked up)");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    throw bad("the port must be a number from 0 to 65535");
  a.port = std::stoi(port);
  if (a.port > 65535) throw bad("the port must be a number from 0 to 65535");
  return a;
}

}  // namespace pipeline::graph
