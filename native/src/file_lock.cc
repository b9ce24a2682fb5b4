#include "file_lock.h"

#include <cerrno>
#include <cstring>
#include <string>

#ifndef _WIN32
#include <sys/file.h>
#endif

namespace ck {

Napi::Value LockFileExclusiveJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 1 || !info[0].IsNumber())
    throw Napi::TypeError::New(env, "lockFileExclusive(fd): fd must be a number");
  const int fd = info[0].As<Napi::Number>().Int32Value();
#ifdef _WIN32
  (void)fd;
  throw Napi::Error::New(env, "lockFileExclusive: flock is not available on Windows");
#else
  // Bounded: EINTR is the only retry, and a non-blocking flock returns at once.
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return Napi::Boolean::New(env, true);
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return Napi::Boolean::New(env, false);
    throw Napi::Error::New(env, std::string("flock: ") + std::strerror(errno));
  }
  throw Napi::Error::New(env, "flock: interrupted 100 times in a row");
#endif
}

}  // namespace ck
