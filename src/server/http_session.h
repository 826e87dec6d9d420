// One HTTP connection: reads requests (body size limit, idle timeout), answers the simple
// endpoints itself and hands completions to a GenerationJob, whose output it writes (plain
// responses, or chunked SSE). Watches the socket while a job runs: a client that goes away
// cancels its engine requests at once. Everything runs on the connection's strand.
#pragma once

#include <utility>  // before Boost 1.74 Asio, whose awaitable.hpp uses std::exchange without it
#include <array>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/api_error.h"
#include "server/server_state.h"

namespace kiln::server {

class GenerationJob;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(boost::asio::ip::tcp::socket socket, SharedState& state);
  ~HttpSession();
  void run();                   // serve requests (counted in the open connections)
  void refuse(ApiError error);  // answer `error` before reading anything, then close (not counted)

  // For the job (on the strand): queue bytes; end the response once they are written.
  void queue_write(std::string bytes);
  void end_response();
  void send_json(int status, const nlohmann::json& body);
  void send_error(const ApiError& error);
  boost::asio::any_io_executor executor() { return stream_.get_executor(); }
  bool keep_alive() const { return keep_alive_; }

 private:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  void do_read();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void handle(Request& req);
  void handle_generation(const Request& req, bool chat);
  void send(Response& res);
  void flush();
  void on_write(boost::beast::error_code ec, size_t bytes);
  void watch_disconnect();
  void client_gone();
  void close();                 // at once (the client is gone, or never sent a request)
  void close_after_response();  // lingering: the client's unread bytes are drained first
  void drain_input();
  bool authorized(const Request& req) const;

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  SharedState& state_;
  std::string out_, writing_;
  std::array<char, 4096> drain_scratch_{};
  bool writing_now_ = false;
  bool response_ended_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool counted_ = false;  // run(): in Metrics::http_connections until destroyed
  unsigned version_ = 11;
  std::shared_ptr<GenerationJob> job_;
  uint64_t job_serial_ = 0;
};

}  // namespace kiln::server
