// Internal helpers shared by the KvStore's source files (kv_store*.cc).
#pragma once

#include <chrono>
#include <string>

namespace attic::store::internal {

// The sessions_ map's key of (tenant, session id).
inline std::string SessionKey(const std::string& tenant, const std::string& session_id) {
  return tenant + std::string(1, '\0') + session_id;
}

inline double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace attic::store::internal
