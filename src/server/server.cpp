#include <utility>  // before Boost 1.74 Asio, whose awaitable.hpp uses std::exchange without it
#include "server/server.h"

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <thread>

#include <boost/asio.hpp>
#include <fmt/core.h>

#include "core/check.h"
#include "kiln/engine.h"
#include "server/http_session.h"
#include "server/server_state.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct Server::State {
  SharedState shared;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor{ioc};
  net::signal_set signals{ioc, SIGINT, SIGTERM};
  net::steady_timer drain_timer{ioc};
  net::steady_timer accept_retry{ioc};
  std::vector<std::thread> threads;
  std::chrono::steady_clock::time_point drain_deadline;
  int signals_seen = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;

  void do_accept();
  void on_signal();
  void begin_drain();
  void check_drained();
  void stop();
};

void Server::State::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      // E.g. EMFILE: keep serving the connections we have, and retry later rather than at once
      // (the failing accept would return immediately and spin an I/O thread).
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec) do_accept();
      });
      return;
    }
    auto session = std::make_shared<HttpSession>(std::move(socket), shared);
    if (shared.metrics.http_connections.load() >= shared.options.max_connections) {
      ++shared.metrics.http_connections_rejected;
      session->refuse(overloaded(503, "too many connections"));
    } else {
      session->run();
    }
    do_accept();
  });
}

void Server::State::on_signal() {
  signals.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    if (++signals_seen > 1) {
      fmt::print(stderr, "kiln serve: second signal, exiting now\n");
      std::_Exit(1);
    }
    fmt::print(stderr, "kiln serve: {} received; draining (new requests get 503) ...\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    begin_drain();
    on_signal();
  });
}

void Server::State::begin_drain() {
  shared.draining = true;
  drain_deadline = std::chrono::steady_clock::now() + shared.options.drain_timeout;
  check_drained();
}

void Server::State::check_drained() {
  bool idle = shared.active_jobs.load() == 0;
  if (idle || std::chrono::steady_clock::now() >= drain_deadline) {
    if (!idle) fmt::print(stderr, "kiln serve: drain timeout; {} requests still running\n", shared.active_jobs.load());
    stop();
    return;
  }
  drain_timer.expires_after(std::chrono::milliseconds(20));
  drain_timer.async_wait([this](boost::system::error_code ec) {
    if (!ec) check_drained();
  });
}

void Server::State::stop() {
  boost::system::error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  signals.cancel(ec);
  work.reset();
  ioc.stop();
  std::lock_guard lock(mu);
  stopped = true;
  cv.notify_all();
}

Server::Server(ServerOptions options) : state_(std::make_unique<State>()) { state_->shared.options = std::move(options); }

Server::~Server() {
  if (state_->threads.empty()) return;
  state_->ioc.stop();
  for (auto& t : state_->threads)
    if (t.joinable()) t.join();
}

void Server::start() {
  State& s = *state_;
  const ServerOptions& o = s.shared.options;
  boost::system::error_code ec;
  auto address = net::ip::make_address(o.host, ec);
  KILN_CHECK(!ec, invalid_argument, "--host '{}' is not an IP address ({})", o.host, ec.message());
  tcp::endpoint endpoint(address, o.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  KILN_CHECK(!ec, io, "cannot listen on {}:{}: {} (is another server using the port? try --port)", o.host, o.port,
             ec.message());
  s.shared.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.work.emplace(s.ioc.get_executor());
  s.do_accept();
  s.on_signal();
  for (int i = 0; i < std::max(1, o.http_threads); ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
}

uint16_t Server::port() const {
  boost::system::error_code ec;
  auto ep = state_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void Server::attach(Engine& engine, ModelInfo model) {
  SharedState& sh = state_->shared;
  sh.no_text_ids.clear();
  for (int32_t id : model.end_of_generation) sh.no_text_ids.insert(id);
  sh.model_root = model.root.empty() ? model.served_name : model.root;
  sh.metrics.bandwidth_ceiling_gbs = model.bandwidth_ceiling_gbs;
  sh.model = std::move(model);
  sh.engine.store(&engine);
}

void Server::wait() {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->stopped; });
  lock.unlock();
  for (auto& t : state_->threads)
    if (t.joinable()) t.join();
  state_->threads.clear();
}

void Server::request_shutdown() {
  net::post(state_->ioc, [s = state_.get()] {
    if (!s->shared.draining) s->begin_drain();
  });
}

bool Server::shutdown_requested() const { return state_->shared.draining.load(); }

}  // namespace kiln::server
