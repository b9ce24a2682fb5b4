#!/usr/bin/env bash
# A real Apache Kafka broker for development and CI: KRaft mode (no
# ZooKeeper), one node acting as broker and controller, on 127.0.0.1.
#
#   deploy/kafka.sh start  [--port P] [--dir D]   start, wait until ready, create the catalog topics
#   deploy/kafka.sh stop   [--dir D]              stop it (SIGTERM, then SIGKILL after 30 s)
#   deploy/kafka.sh status [--port P] [--dir D]   exit 0 when running and answering
#
# The broker is the Maven Central artifact org.apache.kafka:kafka_2.13 (the
# version is pinned in deploy/kafka/pom.xml) with its runtime dependencies,
# fetched once by `mvn dependency:copy-dependencies` into deploy/.cache/ and run
# with `java -cp`. The controller listens on P+1. Data, pid and logs live in D
# (default .continuum/kafka-P), the JVM's GC log in D/gc.log. Topics are never auto-created: `start` creates
# catalog.proposals, catalog.tx and catalog.rejections, each with one
# partition, through the admin client (deploy/kafka/ready.ts). Readiness is
# polled through the admin client, never slept.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
POM="$ROOT/deploy/kafka/pom.xml"
VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")"
LIBS="$ROOT/deploy/.cache/kafka-$VERSION/libs"

cmd="${1:-}"; shift || true
PORT=9092
DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    *) echo "kafka.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case "$PORT" in ''|*[!0-9]*) echo "kafka.sh: --port must be a number, got '$PORT'" >&2; exit 2 ;; esac
CPORT=$((PORT + 1))
DIR="${DIR:-$ROOT/.continuum/kafka-$PORT}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/kafka.pid"
# The broker's heap and collector (CONTINUUM_KAFKA_JVM_OPTS overrides). Serial GC
# keeps the footprint small, but its stop-the-world collections stall every
# producer and consumer at once. The young generation sets how often: with
# Kafka's own default heap (1 GiB) and 384 MiB of it young, the catalog bench's
# 15 s lag run at 5,000 proposals/s meets one young pause (20-33 ms) instead of
# eight (12-26 ms each) with a 128-512 MiB heap sized by the JVM. A 512 MiB young
# generation in a 768 MiB heap left the old generation too small: a 191 ms full
# collection.
BROKER_JVM_OPTS="${CONTINUUM_KAFKA_JVM_OPTS:--Xms1g -Xmx1g -Xmn384m -XX:+UseSerialGC}"

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

fetch_jars() {
  if [ -f "$LIBS/kafka_2.13-$VERSION.jar" ]; then return; fi
  echo "kafka.sh: fetching Kafka $VERSION jars from Maven Central into $LIBS" >&2
  mkdir -p "$LIBS.partial"
  mvn -q -B -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$LIBS.partial" >&2
  rm -rf "$LIBS"; mv "$LIBS.partial" "$LIBS"
}

write_config() {
  cat > "$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
log.retention.hours=-1
PROPS
}

java_run() {
  java -Xms128m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$ROOT/deploy/kafka/log4j.properties" -Dkafka.logs.dir="$DIR" \
    -cp "$LIBS/*" "$@"
}

ready() { (cd "$ROOT" && node --import tsx deploy/kafka/ready.ts "127.0.0.1:$PORT" "$@"); }

case "$cmd" in
  start)
    if running; then echo "kafka.sh: already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"; exit 0; fi
    command -v java >/dev/null || { echo "kafka.sh: java (17+) is required" >&2; exit 1; }
    fetch_jars
    write_config
    if [ ! -f "$DIR/data/meta.properties" ]; then
      java_run kafka.tools.StorageTool format -t "$(java_run kafka.tools.StorageTool random-uuid)" \
        -c "$DIR/server.properties" >"$DIR/format.log" 2>&1 \
        || { cat "$DIR/format.log" >&2; exit 1; }
    fi
    # shellcheck disable=SC2086 # BROKER_JVM_OPTS is a list of options
    nohup java $BROKER_JVM_OPTS -Xlog:gc:file="$DIR/gc.log" -Djava.awt.headless=true \
      -Dlog4j.configuration="file:$ROOT/deploy/kafka/log4j.properties" -Dkafka.logs.dir="$DIR" \
      -cp "$LIBS/*" kafka.Kafka "$DIR/server.properties" >"$DIR/stdout.log" 2>&1 &
    echo $! > "$PIDFILE"
    # Poll the admin client until the broker answers (120 s bound), then create the topics.
    if ! ready --wait-ms 120000 --create-topics --broker-pid "$(cat "$PIDFILE")"; then
      echo "kafka.sh: broker did not become ready; last log lines:" >&2
      tail -n 30 "$DIR/server.log" "$DIR/stdout.log" >&2 || true
      exit 1
    fi
    echo "kafka.sh: Kafka $VERSION ready on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), dir $DIR)"
    ;;
  stop)
    if ! running; then echo "kafka.sh: not running"; rm -f "$PIDFILE"; exit 0; fi
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    rm -f "$PIDFILE"
    echo "kafka.sh: stopped"
    ;;
  status)
    if running && ready --wait-ms 5000; then echo "kafka.sh: running on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"; exit 0; fi
    echo "kafka.sh: not running on 127.0.0.1:$PORT"; exit 1
    ;;
  *)
    echo "usage: deploy/kafka.sh start|stop|status [--port P] [--dir D]" >&2; exit 2 ;;
esac
