// opt-serve's HTTP layer on Boost.Beast and Boost.Asio: one event-driven session per connection (no thread per
// connection), routing to the endpoints of api.hpp, and the deadlines that keep slow or idle clients from holding
// the server.
//
// A session reads a request head within --head-timeout (also the keep-alive idle time), its body within
// --body-timeout, and writes each answer within --timeout. A body needs a Content-Length of at most
// --max-body-bytes (413 otherwise; a chunked upload gets 411 before a byte of it is read). While a generation runs,
// the session watches its socket: a client that closes it (or resets it) cancels its request, and the scheduler
// frees the sequences at its next step (Batch::stop). Beyond --max-connections open connections a new one gets a
// 503 at once and is closed. HTTP/1.1 connections persist unless the client asks "Connection: close".
#pragma once
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api.hpp"
#include "page.hpp"

namespace opt_serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;

// The open sessions, shared with each of them: a session may outlive the HttpServer (a handler still queued in
// the io_context when it is destroyed).
struct Sessions {
  std::mutex mu;
  std::map<uint64_t, std::weak_ptr<Session>> open;
  uint64_t next_id = 0;

  uint64_t add(const std::weak_ptr<Session>& s) {
    std::lock_guard<std::mutex> lk(mu);
    open.emplace(++next_id, s);
    return next_id;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    open.erase(id);
  }
  std::vector<std::shared_ptr<Session>> all() {
    std::vector<std::shared_ptr<Session>> out;
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [id, w] : open)
      if (auto s = w.lock()) out.push_back(std::move(s));
    return out;
  }
};

// The listening socket and the open sessions.
class HttpServer {
 public:
  HttpServer(Server& s, net::io_context& ioc)
      : server_(s), ioc_(ioc), acceptor_(net::make_strand(ioc)), retry_(acceptor_.get_executor()) {}

  // Binds host:port (0: any free port) and returns the port; throws std::runtime_error when it cannot.
  int listen(const std::string& host, int port) {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec || results.empty()) throw std::runtime_error("cannot resolve " + host + ": " + ec.message());
    const tcp::endpoint ep = results.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
    return acceptor_.local_endpoint().port();
  }

  void start() { accept(); }

  // Stops accepting and closes every connection that waits for a request; those with a request running end
  // after their answer (the scheduler's shutdown fails what is left).
  void begin_shutdown();

  // After the I/O threads ended: every session lets go of its request (a request's hook holds its session).
  void abandon_all();

  // Draining (SIGTERM with --drain-timeout): every answer from now on closes its connection, so that a proxy's
  // next request opens a new one (to a replica that is not going away, when the proxy balances).
  void begin_drain() { draining_ = true; }

  Server& server() { return server_; }
  bool stopping() const { return stopping_; }
  bool closing() const { return stopping_ || draining_; }  // no more keep-alive
  const std::shared_ptr<Sessions>& sessions() const { return sessions_; }

 private:
  void accept();

  Server& server_;
  net::io_context& ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer retry_;  // after an accept error (no file descriptors left): try again a little later
  std::atomic<bool> stopping_{false}, draining_{false};
  std::shared_ptr<Sessions> sessions_ = std::make_shared<Sessions>();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `counted`: an open connection of the --max-connections cap (a refused one is not).
  Session(HttpServer& h, tcp::socket&& socket, bool counted)
      : h_(h), s_(h.server()), sessions_(h.sessions()), stream_(std::move(socket)), counted_(counted) {
    if (counted_) ++s_.connections;
  }
  ~Session() {
    if (counted_) --s_.connections;
    if (id_) sessions_->remove(id_);
  }

  void start() {
    id_ = sessions_->add(weak_from_this());
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_head(); });
  }

  // Over --max-connections: a 503 at once, then close.
  void refuse() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->keep_alive_ = false;
      self->write_reply(error_reply({503, "the server has too many open connections; retry later", "server_error", "",
                                     "too_many_connections"}),
                        true);
    });
  }

  // After the I/O threads ended (no handler runs): drop the request and its hook.
  void abandon() {
    if (req_) unhook(*req_);
    req_.reset();
    stream_req_.reset();
    answer_ = nullptr;
  }

  // Shutdown: a connection that waits for (or reads) a request is closed now.
  void stop_if_idle() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (self->state_ == State::head || self->state_ == State::body) self->close();
    });
  }

 private:
  enum class State { head, body, busy, closing };
  using Clock = std::chrono::steady_clock;

  const ServerOptions& o() const { return s_.o; }
  tcp::socket& socket() { return beast::get_lowest_layer(stream_).socket(); }

  // ---- reading a request -------------------------------------------------------------------------------------

  void read_head() {
    if (h_.stopping()) return close();
    state_ = State::head;
    endpoint_ = "other";
    head_.emplace();
    head_->header_limit(8192);
    stream_.expires_after(std::chrono::seconds(o().head_timeout_s));
    http::async_read_header(stream_, buffer_, *head_,
                            beast::bind_front_handler(&Session::on_head, shared_from_this()));
  }

  static bool network_error(const beast::error_code& ec) {
    return ec.category() != http::make_error_code(http::error::end_of_stream).category() ||
           ec == http::error::end_of_stream || ec == http::error::partial_message;
  }

  void on_head(beast::error_code ec, size_t) {
    if (ec) {
      // the client left, went quiet past the deadline, or the server closed the connection: nothing to answer
      if (network_error(ec)) return close();
      keep_alive_ = false;
      // a head beyond the 8 KiB limit: 431 Request Header Fields Too Large
      if (ec == http::error::header_limit)
        return write_reply(error_reply({431, "the request header is too large (at most 8192 bytes)",
                                        "invalid_request_error", "", "request_header_fields_too_large"}),
                           true);
      // a request Beast cannot parse
      return write_reply(error_reply(bad_request("malformed HTTP request: " + ec.message())), true);
    }
    arrived_ = Clock::now();
    auto& req = head_->get();
    keep_alive_ = req.keep_alive();
    const beast::string_view target = req.target();
    path_ = std::string(target.substr(0, std::min(target.size(), target.find('?'))));
    for (const char* known : {"/generate", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
                              "/detokenize", "/"})
      if (path_ == known) endpoint_ = known;
    const bool has_body = head_->chunked() || (head_->content_length() && *head_->content_length() > 0);
    // a chunked body would be read whole before its size is known: a request body needs a Content-Length
    if (head_->chunked())
      return refuse_body({411, "a request body needs a Content-Length (no Transfer-Encoding)",
                          "invalid_request_error", "", "length_required"});
    if (head_->content_length() && *head_->content_length() > o().max_body_bytes)
      return refuse_body(
          {413, "the request body is too large (at most " + std::to_string(o().max_body_bytes) + " bytes)",
           "invalid_request_error", "", "payload_too_large"});
    if (!authorized(req)) {
      const ApiError e{401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                       "invalid_request_error", "", "invalid_api_key"};
      if (has_body) return refuse_body(e);
      return write_reply(error_reply(e));
    }
    body_.emplace(std::move(*head_));
    head_.reset();
    body_->body_limit(o().max_body_bytes);
    if (body_->is_done()) return on_body({}, 0);
    state_ = State::body;
    stream_.expires_after(std::chrono::seconds(o().body_timeout_s));
    auto expect = body_->get().find(http::field::expect);
    if (expect != body_->get().end() && beast::iequals(expect->value(), "100-continue")) {
      static const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(stream_, net::buffer(cont), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e) return self->close();
        self->read_body();
      });
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *body_, beast::bind_front_handler(&Session::on_body, shared_from_this()));
  }

  // Answers without reading the body, then closes (after draining what the client still sends, so that it reads
  // the answer rather than a reset).
  void refuse_body(const ApiError& e) {
    keep_alive_ = false;
    write_reply(error_reply(e), true);
  }

  bool authorized(const http::request<http::empty_body>& req) const {
    // the page at "/" holds no data: a browser loads it without a key, which the page then sends for its calls
    if (s_.api_key.empty() || path_ == "/health" || path_ == "/") return true;
    auto it = req.find(http::field::authorization);
    if (it == req.end()) return false;
    const beast::string_view v = it->value();
    if (v.size() < 7 || !beast::iequals(v.substr(0, 7), "Bearer ")) return false;
    const beast::string_view key = v.substr(7);
    // constant time in the key's bytes
    unsigned diff = key.size() != s_.api_key.size();
    for (size_t i = 0; i < s_.api_key.size(); ++i)
      diff |= unsigned(i < key.size() ? key[i] : 0) ^ unsigned(s_.api_key[i]);
    return diff == 0;
  }

  void on_body(beast::error_code ec, size_t) {
    if (ec) {
      if (network_error(ec)) return close();
      keep_alive_ = false;
      if (ec == http::error::body_limit)
        return write_reply(error_reply({413, "the request body is too large", "invalid_request_error", "",
                                        "payload_too_large"}),
                           true);
      return write_reply(error_reply(bad_request("malformed HTTP request: " + ec.message())), true);
    }
    stream_.expires_never();
    state_ = State::busy;
    route();
  }

  // ---- routing --------------------------------------------------------------------------------------------------

  void route() {
    const http::verb m = body_->get().method();
    const std::string& body = body_->get().body();
    // HEAD: the GET answer's status and headers, without its body
    head_only_ = m == http::verb::head;
    const bool post = m == http::verb::post, get = m == http::verb::get || head_only_;
    if (post && path_ == "/generate") return start_generate(body);
    if (post && path_ == "/v1/completions") return start_completion(body);
    Reply r;
    if (post && path_ == "/tokenize")
      r = guarded([&] { return Reply{200, s_.parser->tokenize(body), "application/json", {}}; });
    else if (post && path_ == "/detokenize")
      r = guarded([&] { return Reply{200, s_.parser->detokenize(body), "application/json", {}}; });
    else if (get && path_ == "/v1/models") r = guarded([&] { return models_reply(s_); });
    else if (get && path_ == "/health") r = guarded([&] { return health_reply(s_); });
    else if (get && path_ == "/metrics") r = guarded([&] { return metrics_reply(s_); });
    else if (get && path_ == "/") r = {200, page_html, "text/html; charset=utf-8", {}};
    else if (get && path_ == "/favicon.ico") r = {204, "", "", {}};
    else r = error_reply({404, "no such endpoint", "invalid_request_error", "", ""});
    write_reply(std::move(r));
  }

  // Queues a generation; `answer` builds the reply once every choice is done (non-streaming requests).
  void start_wait(std::shared_ptr<Request> r, std::function<Reply()> answer) {
    r->arrived = arrived_;
    hook(*r);
    try {
      submit(s_, r);
    } catch (...) {
      unhook(*r);
      throw;
    }
    req_ = std::move(r);
    answer_ = std::move(answer);
    watch();
  }

  void start_generate(const std::string& body) {
    Reply err = guarded([&] {
      auto r = s_.parser->parse_generate(body);
      start_wait(r, [this, r] { return generate_reply(s_, *r); });
      return Reply{};
    });
    if (!req_) write_reply(std::move(err));
  }

  void start_completion(const std::string& body) {
    Reply err = guarded([&] {
      auto cr = std::make_shared<CompletionRequest>(s_.parser->parse_completion(body));
      if (!cr->stream) {
        start_wait(cr->req, [this, cr] { return completion_reply(s_, *cr); });
        return Reply{};
      }
      cr->req->arrived = arrived_;
      hook(*cr->req);
      try {
        submit(s_, cr->req);
      } catch (...) {
        unhook(*cr->req);
        throw;
      }
      req_ = cr->req;
      stream_req_ = cr;
      return Reply{};
    });
    if (!req_) return write_reply(std::move(err));
    if (stream_req_) start_stream();
  }

  // The scheduler calls the request's hook after each change; it runs on_progress on this session's strand.
  void hook(Request& r) {
    std::lock_guard<std::mutex> lk(r.m);
    r.on_update = [self = shared_from_this()] {
      net::post(self->stream_.get_executor(), [self] { self->on_progress(); });
    };
  }
  static void unhook(Request& r) {
    std::lock_guard<std::mutex> lk(r.m);
    r.on_update = nullptr;
  }

  // The request is over for this session: no more hooks, no more watching.
  void release_request() {
    if (!req_) return;
    unhook(*req_);
    ++watch_gen_;
    beast::error_code ec;
    socket().cancel(ec);  // the pending watch (nothing else is pending here)
    req_.reset();
    stream_req_.reset();
    answer_ = nullptr;
  }

  void on_progress() {
    if (!req_ || state_ != State::busy) return;
    if (stream_req_) return pump();
    {
      std::lock_guard<std::mutex> lk(req_->m);
      if (req_->remaining != 0) return;
    }
    observe_first_tokens(s_, *req_);
    Reply r = guarded([&] { return answer_(); });
    if (r.status == 200) latency_pending_ = true;
    release_request();
    write_reply(std::move(r));
  }

  // ---- watching a waiting client ----------------------------------------------------------------------------------

  // Waits for the socket to become readable: data (a pipelined request, kept for later) or its end.
  void watch() {
    if (!req_ || buffer_.size() >= 65536) return;  // a client that sends that much is still there
    socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen = watch_gen_](beast::error_code ec) {
      self->on_watch(ec, gen);
    });
  }

  void on_watch(beast::error_code ec, uint64_t gen) {
    if (gen != watch_gen_ || !req_ || ec == net::error::operation_aborted) return;
    if (!ec) {
      socket().non_blocking(true, ec);
      const size_t n = ec ? 0 : socket().read_some(buffer_.prepare(4096), ec);
      if (ec == net::error::would_block || ec == net::error::try_again) return watch();
      if (!ec) {
        buffer_.commit(n);
        return watch();
      }
    }
    client_gone();
  }

  // The client closed its connection (or a write to it failed) while its request was queued or running.
  void client_gone() {
    if (req_) {
      req_->cancelled = true;
      s_.sched->wake();
      s_.metrics.count_request(endpoint_, "cancelled");
      release_request();
    }
    close();
  }

  // ---- streaming --------------------------------------------------------------------------------------------------

  void start_stream() {
    sres_.emplace(http::status::ok, 11);
    sres_->set(http::field::content_type, "text/event-stream");
    sres_->set(http::field::cache_control, "no-cache");
    sres_->set("X-Accel-Buffering", "no");
    sres_->keep_alive(keep_alive_ && !h_.closing());
    sres_->chunked(true);
    sser_.emplace(*sres_);
    sst_ = StreamState{};
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(o().timeout_s));
    http::async_write_header(stream_, *sser_, beast::bind_front_handler(&Session::on_stream_write, shared_from_this()));
    watch();
  }

  void pump() {
    if (writing_ || !stream_req_) return;
    chunk_.clear();
    const bool over = stream_events(s_, *stream_req_, sst_, chunk_);
    if (chunk_.empty() && !over) return;
    writing_ = true;
    stream_over_ = over;
    stream_.expires_after(std::chrono::seconds(o().timeout_s));
    auto done = beast::bind_front_handler(&Session::on_stream_write, shared_from_this());
    if (chunk_.empty()) return net::async_write(stream_, http::make_chunk_last(), std::move(done));
    if (!over) return net::async_write(stream_, http::make_chunk(net::buffer(chunk_)), std::move(done));
    // the last events and the end of the body in one write
    last_.clear();
    last_ += beast::buffers_to_string(http::make_chunk(net::buffer(chunk_)));
    last_ += beast::buffers_to_string(http::make_chunk_last());
    net::async_write(stream_, net::buffer(last_), std::move(done));
  }

  void on_stream_write(beast::error_code ec, size_t) {
    writing_ = false;
    stream_.expires_never();
    if (ec) return client_gone();
    // the client closed its end while this write was completing (the watch saw it first): the session let go of
    // the request and is closing
    if (!req_) return;
    if (!stream_over_) return pump();
    // the stream is over
    std::string outcome = "ok";
    {
      std::lock_guard<std::mutex> lk(req_->m);
      if (!req_->failure.empty()) outcome = "unavailable";
    }
    observe_first_tokens(s_, *req_);
    if (outcome == "ok")
      s_.metrics.latency_seconds.observe(std::chrono::duration<double>(Clock::now() - arrived_).count());
    s_.metrics.count_request(endpoint_, outcome);
    const bool keep = sres_->keep_alive();
    release_request();
    sser_.reset();
    sres_.reset();
    stream_over_ = false;
    if (keep && !h_.closing()) return read_head();
    shutdown_and_close(false);
  }

  // ---- writing an answer ------------------------------------------------------------------------------------------

  // Writes `r`; then reads the next request, or closes (`drain`: the request's body was not read, so what the
  // client still sends is read and dropped for a moment before the close).
  void write_reply(Reply r, bool drain = false) {
    state_ = State::busy;
    s_.metrics.count_request(endpoint_, Metrics::outcome_of(r.status));
    res_.emplace(http::status(r.status), 11);
    if (!r.content_type.empty()) res_->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res_->set(k, v);
    res_->body() = std::move(r.body);
    res_->keep_alive(keep_alive_ && !drain && !h_.closing());
    res_->prepare_payload();
    if (head_only_) res_->body().clear();  // Content-Length stays the GET answer's
    head_only_ = false;
    stream_.expires_after(std::chrono::seconds(o().timeout_s));
    http::async_write(stream_, *res_, [self = shared_from_this(), drain](beast::error_code ec, size_t) {
      self->on_written(ec, drain);
    });
  }

  void on_written(beast::error_code ec, bool drain) {
    if (latency_pending_) {
      latency_pending_ = false;
      if (!ec) s_.metrics.latency_seconds.observe(std::chrono::duration<double>(Clock::now() - arrived_).count());
    }
    if (ec) return close();
    const bool keep = res_->keep_alive();
    res_.reset();
    body_.reset();
    if (keep) return read_head();
    shutdown_and_close(drain);
  }

  // Sends FIN, then reads until the client closes too (at most 1 s and 8 MiB, dropped), then closes: a client
  // still sending (a body the server did not read) reads the answer instead of a reset.
  void shutdown_and_close(bool drain) {
    state_ = State::closing;
    beast::error_code ec;
    socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(std::chrono::milliseconds(drain ? 1000 : 500));
    drained_ = 0;
    drain_some();
  }

  void drain_some() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(65536), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (8u << 20)) return self->close();
      self->drain_some();
    });
  }

  void close() {
    state_ = State::closing;
    if (req_) {  // a request still queued or running: nobody will read its answer
      req_->cancelled = true;
      s_.sched->wake();
      release_request();
    }
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  HttpServer& h_;
  Server& s_;
  std::shared_ptr<Sessions> sessions_;
  beast::tcp_stream stream_;
  bool counted_;
  uint64_t id_ = 0;
  State state_ = State::head;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> head_;
  std::optional<http::request_parser<http::string_body>> body_;
  std::optional<http::response<http::string_body>> res_;
  bool keep_alive_ = true, latency_pending_ = false, head_only_ = false;
  std::string path_, endpoint_ = "other";
  Clock::time_point arrived_;
  // a generation: the request, and how to answer it (non-streaming) or where its stream is
  std::shared_ptr<Request> req_;
  std::function<Reply()> answer_;
  std::shared_ptr<CompletionRequest> stream_req_;
  StreamState sst_;
  std::optional<http::response<http::empty_body>> sres_;
  std::optional<http::response_serializer<http::empty_body>> sser_;
  std::string chunk_, last_;
  bool writing_ = false, stream_over_ = false;
  uint64_t watch_gen_ = 0;
  size_t drained_ = 0;
};

inline void HttpServer::accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!acceptor_.is_open() || stopping_) return;
      // EMFILE / ENFILE and the like: the connections open now must end first
      static std::atomic<bool> told{false};
      if (!told.exchange(true)) std::fprintf(stderr, "opt-serve: accept failed: %s\n", ec.message().c_str());
      retry_.expires_after(std::chrono::milliseconds(50));
      retry_.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // server-sent events go out as they come
    const bool over = server_.connections.load() >= server_.o.max_connections;
    auto s = std::make_shared<Session>(*this, std::move(socket), !over);
    if (over) s->refuse();
    else s->start();
    accept();
  });
}

inline void HttpServer::begin_shutdown() {
  stopping_ = true;
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ec;
    acceptor_.close(ec);
    retry_.cancel();
  });
  for (auto& s : sessions_->all()) s->stop_if_idle();
}

inline void HttpServer::abandon_all() {
  for (auto& s : sessions_->all()) s->abandon();
}

}  // namespace opt_serve
