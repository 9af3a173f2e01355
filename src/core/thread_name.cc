#include "attic/core/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace attic {

void NameThisThread(const char* name) {
  char cut[16];
  std::strncpy(cut, name, sizeof(cut) - 1);
  cut[sizeof(cut) - 1] = '\0';
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace attic
