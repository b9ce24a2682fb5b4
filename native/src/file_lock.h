// An exclusive, process-lifetime lock on an open file (flock(2)), for the
// data-dir lock (worker/store/dir-lock.ts). Node has no flock; the kernel
// releases the lock when the last descriptor of its open file description
// closes, so a process killed with SIGKILL never leaves a stale lock.
#pragma once

#include <napi.h>

namespace ck {

// lockFileExclusive(fd) → true when this open file description now holds the
// exclusive lock, false when another one holds it (never waits); throws on
// any other error (a bad descriptor, a file system without locks).
Napi::Value LockFileExclusiveJs(const Napi::CallbackInfo& info);

}  // namespace ck
