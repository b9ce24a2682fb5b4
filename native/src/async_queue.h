// A bounded FIFO of jobs served by one native thread, each job resolving its
// own JavaScript promise. The engine has two: compute (steps, weight loading)
// and transfer (page download/upload/copy), so a restore or checkpoint never
// waits behind a long prefill and vice versa.
//
// Thread rules: submit/close_and_join run on the JS thread; Job::execute runs
// on the queue's thread; Job::settle runs back on the JS thread through one
// thread-safe function per queue, which is referenced only while jobs are
// pending so an idle engine never keeps Node alive.
#pragma once

#include <napi.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ck {

class Job {
 public:
  explicit Job(Napi::Env env) : deferred_(Napi::Promise::Deferred::New(env)) {}
  virtual ~Job() = default;
  Napi::Promise promise() const { return deferred_.Promise(); }
  // Keeps a JS value (an input or output buffer, the engine object) alive
  // until the job settles.
  void keep(Napi::Value v) { kept_.push_back(Napi::Persistent(v)); }
  // The work, off the JS thread. Throwing rejects the promise with the message.
  virtual void execute() = 0;
  // The resolution value, on the JS thread.
  virtual Napi::Value result(Napi::Env env) { return env.Undefined(); }

  void run() {
    try {
      execute();
    } catch (const std::exception& e) {
      error_ = e.what();
      failed_ = true;
    }
  }
  void fail(std::string message) {
    error_ = std::move(message);
    failed_ = true;
  }
  void settle(Napi::Env env) {
    Napi::HandleScope scope(env);
    if (failed_) {
      deferred_.Reject(Napi::Error::New(env, error_).Value());
    } else {
      deferred_.Resolve(result(env));
    }
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::vector<Napi::Reference<Napi::Value>> kept_;
  std::string error_;
  bool failed_ = false;
};

class AsyncQueue {
 public:
  // background: the queue's thread runs at lower priority (lower_thread_priority).
  AsyncQueue(Napi::Env env, const char* name, size_t capacity, bool background);
  ~AsyncQueue();
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  // Takes ownership. Throws a JS error when the queue is full or closed.
  Napi::Promise submit(Napi::Env env, Job* job);
  // Lets the running job finish, rejects queued ones with "engine freed",
  // joins the thread. Idempotent.
  void close_and_join();

 private:
  void loop();
  static void deliver(Napi::Env env, Napi::Function, Job* job);
  void settled(Napi::Env env);

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> jobs_;
  bool closing_ = false;
  bool joined_ = false;
  size_t pending_ = 0;  // submitted, not yet settled (JS thread only)
  Napi::ThreadSafeFunction tsfn_;
  std::thread thread_;
};

}  // namespace ck
