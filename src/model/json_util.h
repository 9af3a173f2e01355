// Exception-free accessors for nlohmann::json used by the model loaders: every type
// mismatch becomes a Status naming the key instead of a thrown json::type_error.
//
// Thread-safety: stateless free functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "attic/core/status.h"

namespace attic::model {

using Json = nlohmann::json;

// Parses `text`; malformed JSON -> DataLoss naming `what` (e.g. the file).
inline StatusOr<Json> ParseJson(const std::string& text, const std::string& what) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(what + ": malformed JSON");
  return j;
}

// The member `key` of object `j`, or nullptr when `j` is not an object, the key is absent
// or its value is null.
inline const Json* FindMember(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// Reads an integer that may be written as 7 or 7.0. Absent -> *out unchanged.
inline Status GetInt64(const Json& j, const char* key, int64_t* out) {
  const Json* v = FindMember(j, key);
  if (v == nullptr) return OkStatus();
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidArgumentError(std::string("'") + key + "' is out of range");
    }
    *out = v->get<int64_t>();
    return OkStatus();
  }
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return OkStatus();
    }
  }
  return InvalidArgumentError(std::string("'") + key + "' must be an integer, got " + v->dump());
}

inline Status GetInt(const Json& j, const char* key, int* out) {
  int64_t v = *out;
  ATTIC_RETURN_IF_ERROR(GetInt64(j, key, &v));
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return InvalidArgumentError(std::string("'") + key + "' is out of range");
  }
  *out = static_cast<int>(v);
  return OkStatus();
}

inline Status GetFloat(const Json& j, const char* key, float* out) {
  const Json* v = FindMember(j, key);
  if (v == nullptr) return OkStatus();
  if (!v->is_number()) {
    return InvalidArgumentError(std::string("'") + key + "' must be a number, got " + v->dump());
  }
  *out = static_cast<float>(v->get<double>());
  return OkStatus();
}

inline Status GetBool(const Json& j, const char* key, bool* out) {
  const Json* v = FindMember(j, key);
  if (v == nullptr) return OkStatus();
  if (!v->is_boolean()) {
    return InvalidArgumentError(std::string("'") + key + "' must be true or false, got " + v->dump());
  }
  *out = v->get<bool>();
  return OkStatus();
}

inline Status GetString(const Json& j, const char* key, std::string* out) {
  const Json* v = FindMember(j, key);
  if (v == nullptr) return OkStatus();
  if (!v->is_string()) {
    return InvalidArgumentError(std::string("'") + key + "' must be a string, got " + v->dump());
  }
  *out = v->get<std::string>();
  return OkStatus();
}

}  // namespace attic::model
