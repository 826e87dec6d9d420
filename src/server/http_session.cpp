#include "server/http_session.h"

#include <sys/socket.h>

#include <sstream>

#include <fmt/format.h>

#include "kiln/error.h"
#include "server/generation_job.h"
#include "server/openai_response.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using nlohmann::json;

namespace {

// Compares in time that depends only on the expected key's length.
bool constant_time_equal(std::string_view expected, std::string_view given) {
  volatile unsigned char diff = expected.size() != given.size();
  for (size_t i = 0; i < expected.size(); ++i)
    diff = diff | (static_cast<unsigned char>(expected[i]) ^ static_cast<unsigned char>(i < given.size() ? given[i] : 0));
  return diff == 0;
}

std::string_view path_of(std::string_view target) {
  size_t q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

}  // namespace

HttpSession::HttpSession(net::ip::tcp::socket socket, SharedState& state) : stream_(std::move(socket)), state_(state) {}

HttpSession::~HttpSession() {
  if (counted_) --state_.metrics.http_connections;
}

void HttpSession::run() {
  counted_ = true;
  ++state_.metrics.http_connections;
  net::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
}

void HttpSession::refuse(ApiError error) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), error = std::move(error)] {
    self->keep_alive_ = false;
    self->send_error(error);  // then close_after_response: the client's request is drained, not reset
  });
}

void HttpSession::do_read() {
  if (closed_) return;
  response_ended_ = false;
  parser_.emplace();
  parser_->body_limit(state_.options.max_body_bytes);
  stream_.expires_after(state_.options.idle_timeout);
  http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
}

void HttpSession::on_read(beast::error_code ec, size_t) {
  if (ec == http::error::body_limit) {
    keep_alive_ = false;
    send_error(ApiError(413, "invalid_request_error",
                        fmt::format("the request is too large (the limit is {} bytes)", state_.options.max_body_bytes)));
    return;
  }
  if (ec == http::error::header_limit) {  // Beast's parser caps the request line and headers at 8 KiB
    keep_alive_ = false;
    send_error(ApiError(431, "invalid_request_error", "the request line and headers are too large (8 KiB at most)"));
    return;
  }
  if (ec) {  // end of stream, timeout, reset, or a malformed request line
    if (ec != http::error::end_of_stream && ec != beast::error::timeout && ec != net::error::connection_reset &&
        ec != net::error::eof && ec != net::error::operation_aborted) {
      keep_alive_ = false;
      send_error(bad_request(fmt::format("malformed HTTP request: {}", ec.message())));
      return;
    }
    close();
    return;
  }
  stream_.expires_never();
  Request req = parser_->release();
  keep_alive_ = req.keep_alive();
  version_ = req.version();
  try {
    handle(req);
  } catch (const ApiError& e) {
    if (e.status == 400 || e.status == 404) ++state_.metrics.rejected_invalid;
    send_error(e);
  } catch (const Error& e) {
    if (e.code() == Errc::invalid_argument) {
      ++state_.metrics.rejected_invalid;
      send_error(bad_request(e.what()));
    } else {
      send_error(ApiError(500, "server_error", e.what()));
    }
  } catch (const std::exception& e) {
    send_error(ApiError(500, "server_error", fmt::format("internal error: {}", e.what())));
  }
}

bool HttpSession::authorized(const Request& req) const {
  if (state_.options.api_key.empty()) return true;
  auto it = req.find(http::field::authorization);
  std::string_view given = it == req.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
  constexpr std::string_view bearer = "Bearer ";
  if (given.substr(0, bearer.size()) != bearer) given = std::string_view();
  else given.remove_prefix(bearer.size());
  return constant_time_equal(state_.options.api_key, given);
}

void HttpSession::handle(Request& req) {
  std::string_view path = path_of(std::string_view(req.target().data(), req.target().size()));
  bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  bool post = req.method() == http::verb::post;
  Engine* engine = state_.engine.load();

  if (req.method() == http::verb::options && !state_.options.allowed_origin.empty()) {
    Response res{http::status::no_content, version_};
    res.set("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set("Access-Control-Allow-Headers", "Authorization, Content-Type");
    send(res);
    return;
  }
  if (path == "/health") {
    if (!get) throw ApiError(405, "invalid_request_error", "use GET /health");
    bool ok = engine && engine->healthy() && !state_.draining;
    const char* status = !engine ? "loading" : state_.draining ? "draining" : ok ? "ok" : "unhealthy";
    send_json(ok ? 200 : 503, {{"status", status}});
    return;
  }
  if (path == "/metrics") {
    if (!get) throw ApiError(405, "invalid_request_error", "use GET /metrics");
    EngineStats stats;
    if (engine) stats = engine->stats();
    Response res{http::status::ok, version_};
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = state_.metrics.render(engine ? &stats : nullptr, state_.model.served_name);
    send(res);
    return;
  }
  if (path == "/" || path == "/index.html") {
    if (!get) throw ApiError(405, "invalid_request_error", "use GET /");
    Response res{http::status::ok, version_};
    res.set(http::field::content_type, "text/html; charset=utf-8");
    res.set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'");
    res.body() = kChatPage;
    send(res);
    return;
  }
  bool api = path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions" ||
             path == "/tokenize" || path == "/detokenize";
  if (!api) throw ApiError(404, "NotFoundError", fmt::format("no such endpoint: {} {}", std::string(req.method_string()), path));
  if (!authorized(req)) throw ApiError(401, "authentication_error", "invalid or missing API key (send 'Authorization: Bearer KEY')");
  if (!engine) throw overloaded(503, "the model is still loading", 5);
  if (state_.draining) {
    ++state_.metrics.rejected_overload;
    throw overloaded(503, "the server is shutting down", 5);
  }
  const ModelInfo& m = state_.model;
  if (path == "/v1/models") {
    if (!get) throw ApiError(405, "invalid_request_error", "use GET /v1/models");
    json card = {{"id", m.served_name},        {"object", "model"},     {"created", state_.created},
                 {"owned_by", "kiln"},         {"root", state_.model_root}, {"parent", nullptr},
                 {"max_model_len", m.max_model_len}, {"permission", json::array()}};
    send_json(200, {{"object", "list"}, {"data", json::array({card})}});
    return;
  }
  if (!post) throw ApiError(405, "invalid_request_error", fmt::format("use POST {}", path));
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    handle_generation(req, path == "/v1/chat/completions");
    return;
  }
  json body = parse_json_body(req.body());
  if (path == "/tokenize") {
    std::vector<int32_t> ids;
    auto flag = [&](const char* name, bool dflt) {
      auto it = body.find(name);
      if (it == body.end() || it->is_null()) return dflt;
      if (!it->is_boolean()) throw bad_request(fmt::format("'{}' must be a boolean", name), name);
      return it->get<bool>();
    };
    if (body.contains("messages")) {
      ids = tokenize_chat(m, parse_messages(body["messages"]), flag("add_generation_prompt", true));
    } else if (body.contains("prompt") && body["prompt"].is_string()) {
      ids = tokenize_prompt(m, body["prompt"].get<std::string>(), flag("add_special_tokens", true));
    } else {
      throw bad_request("/tokenize needs 'prompt' (a string) or 'messages'", "prompt");
    }
    send_json(200, {{"count", ids.size()}, {"max_model_len", m.max_model_len}, {"tokens", ids}});
    return;
  }
  if (path == "/detokenize") {
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) throw bad_request("/detokenize needs 'tokens' (an array of ids)", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.vocab_size)
        throw bad_request(fmt::format("token id {} is outside the vocabulary [0, {})", t.dump(), m.vocab_size), "tokens");
      ids.push_back(t.get<int32_t>());
    }
    send_json(200, {{"prompt", m.tokenizer->decode(ids)}});
    return;
  }
  throw ApiError(404, "NotFoundError", fmt::format("no such endpoint: POST {}", path));
}

void HttpSession::handle_generation(const Request& req, bool chat) {
  Engine* engine = state_.engine.load();
  if (!engine->healthy())
    throw ApiError(500, "server_error", "the engine has failed (a fatal device error); see /health and the server log");
  auto arrival = GenerationJob::Clock::now();
  json body = parse_json_body(req.body());
  ParsedRequest parsed = chat ? parse_chat_request(body, state_.model) : parse_completion_request(body, state_.model);
  if (state_.active_jobs.load() >= state_.options.max_concurrent_requests) {
    ++state_.metrics.rejected_overload;
    throw overloaded(429, fmt::format("too many requests in flight (the limit is {}); retry shortly",
                                      state_.options.max_concurrent_requests));
  }
  auto job = std::make_shared<GenerationJob>(state_, shared_from_this(), std::move(parsed), arrival);
  job->start();  // throws ApiError when the engine refuses
  job_ = std::move(job);
  ++job_serial_;
  watch_disconnect();
}

void HttpSession::watch_disconnect() {
  stream_.socket().async_wait(
      net::ip::tcp::socket::wait_read,
      [self = shared_from_this(), serial = job_serial_](beast::error_code ec) {
        if (self->closed_ || serial != self->job_serial_ || !self->job_) return;
        if (ec) {
          self->client_gone();
          return;
        }
        char c;
        ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) self->client_gone();
        // n > 0: the client sent more (a pipelined request); it is read after this response.
      });
}

void HttpSession::client_gone() {
  if (job_) job_->abandon();
  job_.reset();
  close();
}

void HttpSession::send(Response& res) {
  res.version(version_);
  res.set(http::field::server, "kiln");
  if (!state_.options.allowed_origin.empty()) res.set(http::field::access_control_allow_origin, state_.options.allowed_origin);
  res.keep_alive(keep_alive_);
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  queue_write(os.str());
  end_response();
}

void HttpSession::send_json(int status, const json& body) {
  Response res{static_cast<http::status>(status), version_};
  res.set(http::field::content_type, "application/json");
  res.body() = dump_json(body);
  send(res);
}

void HttpSession::send_error(const ApiError& e) {
  Response res{static_cast<http::status>(e.status), version_};
  res.set(http::field::content_type, "application/json");
  if (e.retry_after_s > 0) res.set(http::field::retry_after, std::to_string(e.retry_after_s));
  if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
  res.body() = dump_json(e.body());
  send(res);
}

void HttpSession::queue_write(std::string bytes) {
  if (closed_) return;
  out_ += bytes;
  flush();
}

void HttpSession::end_response() {
  response_ended_ = true;
  flush();
}

void HttpSession::flush() {
  if (closed_ || writing_now_) return;
  if (out_.empty()) {
    if (!response_ended_) return;
    // The response is out: the next request, or the end of the connection.
    job_.reset();
    if (!keep_alive_ || state_.draining) {
      close_after_response();
      return;
    }
    do_read();
    return;
  }
  writing_now_ = true;
  writing_.swap(out_);
  out_.clear();
  stream_.expires_after(state_.options.write_timeout);
  net::async_write(stream_, net::buffer(writing_), beast::bind_front_handler(&HttpSession::on_write, shared_from_this()));
}

void HttpSession::on_write(beast::error_code ec, size_t) {
  writing_now_ = false;
  writing_.clear();
  if (ec) {
    client_gone();
    return;
  }
  stream_.expires_never();
  flush();
}

void HttpSession::close() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ec;
  stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ec);
  stream_.socket().close(ec);
}

void HttpSession::close_after_response() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ec;
  stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ec);
  if (ec) {
    stream_.socket().close(ec);
    return;
  }
  // Closing with request bytes unread (the rest of a body over --max-body-bytes, a pipelined
  // request after a malformed one) makes the kernel reset the connection, and a reset can destroy
  // the response still in flight to the client. So read and discard until the client closes, for
  // at most a second.
  stream_.expires_after(std::chrono::seconds(1));
  drain_input();
}

void HttpSession::drain_input() {
  stream_.async_read_some(net::buffer(drain_scratch_), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) {
      beast::error_code ignored;
      self->stream_.socket().close(ignored);
      return;
    }
    self->drain_input();
  });
}

}  // namespace kiln::server
