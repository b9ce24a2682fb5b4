#!/usr/bin/env bash
# A local S3-compatible server (S3Proxy, filesystem backend) on 127.0.0.1 for
# developers and tests.
#
#   deploy/s3proxy.sh start  [--port P] [--data DIR]   start (no-op if already up)
#   deploy/s3proxy.sh stop   [--port P]                stop the one on port P
#   deploy/s3proxy.sh status [--port P]                "running pid=N port=P data=DIR" or exit 1
#   deploy/s3proxy.sh fetch                            only download the jars
#
# Credentials are fixed test values (signature v2 or v4):
#   access key "continuum", secret "continuum-secret" (the config defaults).
# Buckets are directories under DIR; the chunk store creates its bucket when
# store.s3.createBucket is set.
#
# The jars come from Maven Central on first use (deploy/s3/pom.xml, about a
# minute) into deploy/.cache/s3proxy/lib, which is git-ignored. Readiness is
# polled (the port answers HTTP), never slept for.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache="$here/.cache/s3proxy"
lib="$cache/lib"
run="$cache/run"

port=9000
data="$root/.continuum/s3proxy"
cmd="${1:-}"
[ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="${2:?--port needs a value}"; shift 2 ;;
    --data) data="${2:?--data needs a value}"; shift 2 ;;
    *) echo "s3proxy.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$port" in '' | *[!0-9]*) echo "s3proxy.sh: --port must be a number, got '$port'" >&2; exit 2 ;; esac

pidfile="$run/$port.pid"
logfile="$run/$port.log"

fetch() {
  if [ -f "$lib/.complete" ]; then return 0; fi
  mkdir -p "$cache"
  # One download at a time, even when two test runs start together.
  exec 9>"$cache/.fetch.lock"
  flock 9
  if [ ! -f "$lib/.complete" ]; then
    echo "s3proxy.sh: fetching S3Proxy from Maven Central (first run only)..." >&2
    rm -rf "$lib"
    mvn -q -B --no-transfer-progress -Dstyle.color=never -f "$here/s3/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$lib" -DincludeScope=runtime >&2
    touch "$lib/.complete"
  fi
  flock -u 9
}

alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

# The data directory a running server was started with.
served_data() { cat "$run/$port.data" 2>/dev/null || echo "$data"; }

# Any HTTP answer (S3Proxy says 403 to an unsigned request) means it serves.
answers() {
  local code
  code="$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$port/" 2>/dev/null || true)"
  [ -n "$code" ] && [ "$code" != "000" ]
}

# True when the listening socket on $port belongs to the recorded pid. A port
# picked as free can be taken by another server before ours binds it; then
# "answers" alone would report someone else's server as ours.
owns_port() {
  local pid hex inode
  pid="$(cat "$pidfile" 2>/dev/null)" || return 1
  hex="$(printf '%04X' "$port")"
  for inode in $(awk -v p=":$hex" '$2 ~ (p "$") && $4 == "0A" { print $10 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    if ls -l "/proc/$pid/fd" 2>/dev/null | grep -q "socket:\[$inode\]"; then return 0; fi
  done
  return 1
}

start() {
  if alive && answers; then
    echo "running pid=$(cat "$pidfile") port=$port data=$(served_data)"
    return 0
  fi
  if answers; then
    echo "s3proxy.sh: port $port is taken by another process" >&2
    exit 1
  fi
  fetch
  mkdir -p "$run" "$data"
  data="$(cd "$data" && pwd)"
  cat >"$run/$port.properties" <<EOF
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=continuum
s3proxy.credential=continuum-secret
jclouds.provider=filesystem-nio2
jclouds.identity=continuum
jclouds.credential=continuum-secret
jclouds.filesystem.basedir=$data
EOF
  # setsid: the server outlives this script and is not killed with its
  # process group; stop() ends it by its recorded pid.
  setsid java -Xmx512m -Dlogback.configurationFile="$here/s3/logback.xml" \
    -cp "$lib/*" org.gaul.s3proxy.Main --properties "$run/$port.properties" \
    >"$logfile" 2>&1 </dev/null &
  echo $! >"$pidfile"
  echo "$data" >"$run/$port.data"
  # Poll readiness: up to 120 s (a cold JVM on a busy 2-core machine).
  for _ in $(seq 1 600); do
    if answers && owns_port; then
      echo "running pid=$(cat "$pidfile") port=$port data=$data"
      return 0
    fi
    if ! alive; then
      echo "s3proxy.sh: S3Proxy exited during start-up; its log:" >&2
      tail -n 30 "$logfile" >&2
      rm -f "$pidfile"
      exit 1
    fi
    sleep 0.2
  done
  echo "s3proxy.sh: S3Proxy did not answer on port $port within 120 s" >&2
  stop
  exit 1
}

stop() {
  if ! [ -f "$pidfile" ]; then
    rm -f "$run/$port.properties" "$logfile"
    echo "stopped port=$port"
    return 0
  fi
  local pid
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile" "$run/$port.data" "$run/$port.properties" "$logfile"
  echo "stopped port=$port"
}

status() {
  if alive && answers; then
    echo "running pid=$(cat "$pidfile") port=$port data=$(served_data)"
    return 0
  fi
  echo "stopped port=$port"
  return 1
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  fetch) fetch ;;
  *)
    echo "usage: deploy/s3proxy.sh start|stop|status|fetch [--port P] [--data DIR]" >&2
    exit 2
    ;;
esac
