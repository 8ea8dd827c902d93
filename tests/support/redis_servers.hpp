// SPDX-License-Identifier: Apache-2.0
// Real Redis servers for the remote tier's tests and benchmark: Debian's redis-server started on
// free loopback ports in a temporary folder — a cluster (masters with replicas, made by
// `redis-cli --cluster create`) or one server without cluster support. Torn down on every exit
// path: the destructor kills and reaps them and removes the folder; each server also dies with
// the process that started it (PR_SET_PDEATHSIG), so an abort or a crash leaves none behind. A
// machine without redis-server or redis-cli is an error, not a skip.
#pragma once

#include <hiredis/hiredis.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace strata::test {

/// Runs `f() -> bool` in a child process (another engine instance); its exit status: 0 when it
/// returned true, 2 when false, 3 when it threw.
template <class F>
int in_child_process(F&& f)
{
  pid_t const child = ::fork();
  if (child < 0) { return -1; }
  if (child == 0) {
    int code = 3;
    try {
      code = f() ? 0 : 2;
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class redis_servers {
 public:
  struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
  };
  using reply = std::unique_ptr<redisReply, reply_deleter>;

  /// `masters` masters with `replicas` replicas each, `cluster-node-timeout` of `node_timeout_ms`.
  static redis_servers cluster(int masters = 3, int replicas = 1, int node_timeout_ms = 2000)
  {
    redis_servers s(masters * (1 + replicas), true, node_timeout_ms);
    std::vector<std::string> args{"--cluster", "create"};
    for (int i = 0; i < s.size(); ++i) {
      args.push_back(s.address(i));
    }
    args.insert(args.end(), {"--cluster-replicas", std::to_string(replicas), "--cluster-yes"});
    s.run_cli(args);
    s.wait_until_ok();
    return s;
  }
  /// One server without cluster support.
  static redis_servers standalone() { return redis_servers(1, false, 0); }

  redis_servers(redis_servers&& o) noexcept
      : dir_(std::move(o.dir_)), ports_(std::move(o.ports_)), pids_(std::move(o.pids_))
  {
    o.pids_.clear();
    o.dir_.clear();
  }
  redis_servers& operator=(redis_servers&&) = delete;
  ~redis_servers()
  {
    for (pid_t p : pids_) {
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
    std::error_code ec;
    if (!dir_.empty()) { std::filesystem::remove_all(dir_, ec); }
  }

  [[nodiscard]] int size() const noexcept { return int(ports_.size()); }
  [[nodiscard]] int port(int i) const { return ports_[std::size_t(i)]; }
  [[nodiscard]] std::string address(int i) const { return "127.0.0.1:" + std::to_string(port(i)); }
  [[nodiscard]] std::vector<std::string> addresses() const
  {
    std::vector<std::string> a;
    for (int i = 0; i < size(); ++i) {
      a.push_back(address(i));
    }
    return a;
  }
  [[nodiscard]] bool alive(int i) const { return pids_[std::size_t(i)] > 0; }

  /// `kill -9` of server `i`.
  void kill(int i)
  {
    pid_t& p = pids_[std::size_t(i)];
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      p = -1;
    }
  }

  /// `kill -STOP` / `kill -CONT` of server `i`: it stops answering, without closing a connection.
  void pause(int i) const { ::kill(pids_[std::size_t(i)], SIGSTOP); }
  void resume(int i) const { ::kill(pids_[std::size_t(i)], SIGCONT); }

  /// One command to server `i` (hiredis' printf-like format); throws if it cannot connect.
  template <class... A>
  reply command(int i, char const* format, A... args) const
  {
    timeval tv{2, 0};
    std::unique_ptr<redisContext, void (*)(redisContext*)> c(redisConnectWithTimeout("127.0.0.1", port(i), tv),
                                                             redisFree);
    if (!c || c->err) { throw std::runtime_error("redis_servers: cannot connect to " + address(i)); }
    redisSetTimeout(c.get(), tv);
    return reply(static_cast<redisReply*>(redisCommand(c.get(), format, args...)));
  }

  /// Servers that are masters now (by `ROLE`), among those alive.
  [[nodiscard]] std::vector<int> masters() const
  {
    std::vector<int> m;
    for (int i = 0; i < size(); ++i) {
      if (!alive(i)) { continue; }
      reply r = command(i, "ROLE");
      if (r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && std::string(r->element[0]->str) == "master") {
        m.push_back(i);
      }
    }
    return m;
  }

  /// Waits until every live node says `cluster_state:ok` and every replica's link to its master is up.
  void wait_until_ok(std::chrono::seconds limit = std::chrono::seconds(30)) const
  {
    auto const end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool ok = true;
      for (int i = 0; ok && i < size(); ++i) {
        if (!alive(i)) { continue; }
        reply info = command(i, "CLUSTER INFO");
        ok = info && info->type == REDIS_REPLY_STRING &&
             std::string(info->str).find("cluster_state:ok") != std::string::npos;
        reply repl = command(i, "INFO replication");
        std::string const text = repl && repl->type == REDIS_REPLY_STRING ? repl->str : "";
        ok = ok &&
             (text.find("role:slave") == std::string::npos || text.find("master_link_status:up") != std::string::npos);
      }
      if (ok) { return; }
      if (std::chrono::steady_clock::now() > end) {
        throw std::runtime_error("redis_servers: cluster not ok in time" + logs());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  /// Waits until every live replica has applied everything its master wrote so far.
  void wait_replicated(std::chrono::seconds limit = std::chrono::seconds(20)) const
  {
    auto offset = [](std::string const& text, std::string const& field) -> long long {
      auto const at = text.find(field);
      return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + field.size() + 1);
    };
    auto const end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool ok = true;
      for (int i = 0; ok && i < size(); ++i) {
        if (!alive(i)) { continue; }
        reply r = command(i, "INFO replication");
        std::string const text = r && r->type == REDIS_REPLY_STRING ? r->str : "";
        if (text.find("role:master") == std::string::npos || text.find("connected_slaves:0") != std::string::npos) {
          continue;
        }
        auto const replica = text.find("slave0:");
        ok = replica != std::string::npos &&
             offset(text.substr(replica), ",offset") >= offset(text, "master_repl_offset");
      }
      if (ok) { return; }
      if (std::chrono::steady_clock::now() > end) {
        throw std::runtime_error("redis_servers: replicas behind" + logs());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  /// The servers' logs (for a failure's message).
  [[nodiscard]] std::string logs() const
  {
    std::ostringstream out;
    for (int i = 0; i < size(); ++i) {
      std::ifstream f(dir_ / ("server-" + std::to_string(port(i)) + ".log"));
      std::string line, last;
      for (int n = 0; std::getline(f, line) && n < 100000; ++n) {
        last = line;
      }
      out << "\n  " << address(i) << ": " << last;
    }
    return out.str();
  }

 private:
  redis_servers(int n, bool clustered, int node_timeout_ms)
  {
    std::string const server = find_program("redis-server");
    dir_ = std::filesystem::temp_directory_path() /
           ("strata-redis-" + std::to_string(::getpid()) + "-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(dir_);
    ports_ = free_ports(n);
    for (int p : ports_) {
      std::vector<std::string> args{
          server,   "--port", std::to_string(p), "--bind", "127.0.0.1", "--protected-mode", "no",
          "--save", "",       "--appendonly",    "no",     "--dir",     dir_.string(),      "--daemonize",
          "no"};
      if (clustered) {
        args.insert(args.end(),
                    {"--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + std::to_string(p) + ".conf",
                     "--cluster-node-timeout", std::to_string(node_timeout_ms)});
      }
      pids_.push_back(spawn(args, dir_ / ("server-" + std::to_string(p) + ".log")));
    }
    auto const end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int i = 0; i < n; ++i) {  // every server answers PING
      for (;;) {
        try {
          reply r = command(i, "PING");
          if (r && r->type == REDIS_REPLY_STATUS) { break; }
        } catch (std::runtime_error const&) {
        }
        if (std::chrono::steady_clock::now() > end) {
          throw std::runtime_error("redis_servers: a server did not start" + logs());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  static std::string find_program(std::string const& name)
  {
    std::string const path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
    std::stringstream dirs(path + ":/usr/bin:/usr/sbin");
    for (std::string d; std::getline(dirs, d, ':');) {
      std::filesystem::path const p = std::filesystem::path(d) / name;
      if (!d.empty() && ::access(p.c_str(), X_OK) == 0) { return p.string(); }
    }
    throw std::runtime_error("redis_servers: " + name + " not found (Debian: apt-get install redis-server)");
  }

  /// `n` consecutive loopback ports free, with their cluster-bus ports (+10000) free too.
  static std::vector<int> free_ports(int n)
  {
    auto is_free = [](int port) {
      int const fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      bool const ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      return ok;
    };
    for (int base = 20000 + int(::getpid() % 1000) * 20, tries = 0; tries < 1000;
         ++tries, base = 20000 + (base - 20000 + 20) % 20000) {
      bool ok = true;
      for (int i = 0; ok && i < n; ++i) {
        ok = is_free(base + i) && is_free(base + i + 10000);
      }
      if (ok) {
        std::vector<int> ports;
        for (int i = 0; i < n; ++i) {
          ports.push_back(base + i);
        }
        return ports;
      }
    }
    throw std::runtime_error("redis_servers: no free loopback ports");
  }

  /// Starts `args` with output to `log`; it dies with this process.
  static pid_t spawn(std::vector<std::string> const& args, std::filesystem::path const& log)
  {
    std::vector<char*> argv;
    for (auto const& a : args) {
      argv.push_back(const_cast<char*>(a.c_str()));
    }
    argv.push_back(nullptr);
    std::string const log_path = log.string();
    pid_t const parent = ::getpid();
    pid_t const pid = ::fork();
    if (pid < 0) { throw std::runtime_error("redis_servers: fork failed"); }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) { ::_exit(1); }
      int const fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }

  void run_cli(std::vector<std::string> const& args) const
  {
    std::vector<std::string> all{find_program("redis-cli")};
    all.insert(all.end(), args.begin(), args.end());
    std::filesystem::path const log = dir_ / "redis-cli.log";
    pid_t const pid = spawn(all, log);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream f(log);
      std::stringstream text;
      text << f.rdbuf();
      throw std::runtime_error("redis_servers: redis-cli " + args[0] + " " + args[1] + " failed:\n" + text.str());
    }
  }

  std::filesystem::path dir_;
  std::vector<int> ports_;
  std::vector<pid_t> pids_;
};

}  // namespace strata::test
