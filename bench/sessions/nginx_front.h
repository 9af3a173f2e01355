// The balancer `attic bench sessions --instances N` puts in front of its servers: an nginx
// started and stopped by scripts/nginx-affinity.sh (docs/serving.md "Several servers
// behind nginx") on a free loopback port, its state directory (configuration, pid file,
// access and error logs) under the benchmark's temporary directory. Stopped by Stop(),
// the destructor, or an interrupted benchmark (AddSignalCleanup); a benchmark killed
// with SIGKILL leaves it running (`scripts/nginx-affinity.sh stop PORT` with
// NGINX_AFFINITY_DIR set to its state directory stops it).
// Thread-safety: used by one thread.
#pragma once

#include <string>
#include <vector>

#include "attic/core/status.h"

namespace attic::bench::sessions {

class NginxFront {
 public:
  NginxFront() = default;
  NginxFront(const NginxFront&) = delete;
  NginxFront& operator=(const NginxFront&) = delete;
  ~NginxFront() { Stop(); }

  // Runs `script start PORT UPSTREAMS --routing ROUTING` for a free PORT (3 tries: a port
  // found free may be taken before nginx binds it). `upstream_urls`: "http://host:port"
  // each; `routing`: affinity, round-robin or random; `state_dir` must not exist yet;
  // the script's output goes to `log_path`. Unavailable (with the log) on failure.
  Status Start(const std::string& script, const std::vector<std::string>& upstream_urls, const std::string& routing,
               const std::string& state_dir, const std::string& log_path);

  // `script stop PORT`. Does nothing when not running.
  void Stop();

  // "http://127.0.0.1:PORT" once started.
  const std::string& url() const { return url_; }

 private:
  std::string script_, state_dir_, log_path_, url_;
  int port_ = 0;
  int cleanup_id_ = -1;
};

}  // namespace attic::bench::sessions
