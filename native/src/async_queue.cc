#include "async_queue.h"

#include "thread_pool.h"

namespace ck {

namespace {
// The job carries its queue so the JS-side callback can update the count.
struct Delivery {
  AsyncQueue* queue;
  Job* job;
};
}  // namespace

AsyncQueue::AsyncQueue(Napi::Env env, const char* name, size_t capacity, bool background) : capacity_(capacity) {
  tsfn_ = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), name, 0, 1);
  tsfn_.Unref(env);
  thread_ = std::thread([this, background] {
    if (background) lower_thread_priority();
    loop();
  });
}

AsyncQueue::~AsyncQueue() { close_and_join(); }

Napi::Promise AsyncQueue::submit(Napi::Env env, Job* job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) {
      delete job;
      throw Napi::Error::New(env, "engine freed");
    }
    if (jobs_.size() >= capacity_) {
      delete job;
      throw Napi::Error::New(env, "engine queue full (" + std::to_string(capacity_) + " jobs waiting)");
    }
    jobs_.push_back(job);
  }
  if (pending_++ == 0) tsfn_.Ref(env);
  Napi::Promise p = job->promise();
  cv_.notify_one();
  return p;
}

void AsyncQueue::loop() {
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return closing_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // closing and drained
      job = jobs_.front();
      jobs_.pop_front();
    }
    job->run();
    tsfn_.BlockingCall(new Delivery{this, job}, [](Napi::Env env, Napi::Function, Delivery* d) {
      d->job->settle(env);
      delete d->job;
      d->queue->settled(env);
      delete d;
    });
  }
}

void AsyncQueue::settled(Napi::Env env) {
  if (--pending_ == 0 && !joined_) tsfn_.Unref(env);
}

void AsyncQueue::close_and_join() {
  std::deque<Job*> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return;
    closing_ = true;
    dropped.swap(jobs_);
  }
  cv_.notify_one();
  thread_.join();
  // Queued jobs never ran: reject them, through the same path so their
  // promises settle in order after the running one.
  for (Job* job : dropped) {
    job->fail("engine freed");
    tsfn_.BlockingCall(new Delivery{this, job}, [](Napi::Env env, Napi::Function, Delivery* d) {
      d->job->settle(env);
      delete d->job;
      d->queue->settled(env);
      delete d;
    });
  }
  joined_ = true;
  tsfn_.Release();
}

}  // namespace ck
