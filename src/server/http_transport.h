// Internal: the HTTP transport under the server. An httplib::Server whose connections
// run through Attic's own socket stream so that a handler blocked on a long generation
// can ask whether its client is still there (httplib 0.11 exposes that only to streaming
// content providers), and whose keep-alive wait notices a stopping server promptly.
//
// Thread-safety: as httplib::Server. ClientConnected() and RequestStart() answer for the
// connection being served on the calling thread.
#pragma once

#include <httplib.h>

#include <chrono>

namespace attic::server {

class HttpTransport : public httplib::Server {
 public:
  // False once the peer of the request being handled on this thread has closed or reset
  // its connection. True when called outside a request.
  static bool ClientConnected();
  // Closes the connection after the response being produced on this thread (e.g. when
  // the rest of an over-long request body was left unread).
  static void CloseAfterResponse();
  // When the request being handled on this thread arrived (its first bytes were readable).
  static std::chrono::steady_clock::time_point RequestStart();
  // Raises the listen backlog of the bound socket (httplib 0.11 listens with 5, which
  // drops connection bursts into SYN retransmits). Call after bind, before listening.
  void SetListenBacklog(int backlog);

 private:
  bool process_and_close_socket(socket_t sock) override;
};

}  // namespace attic::server
