// Named threads (Linux: 15 characters at most, longer names are cut), so that `top -H`,
// `ps -L` and profilers tell Attic's threads apart: the compute pool, the step loop, HTTP
// workers, the KV loader, the store's writer and prefetcher. Threads inherit the name of
// the thread that starts them.
#pragma once

#include <string>
#include <thread>
#include <utility>

namespace attic {

void NameThisThread(const char* name);

// A std::thread that names itself `name`, then runs fn().
template <class Fn>
std::thread StartNamedThread(std::string name, Fn fn) {
  return std::thread([name = std::move(name), fn = std::move(fn)]() mutable {
    NameThisThread(name.c_str());
    fn();
  });
}

}  // namespace attic
