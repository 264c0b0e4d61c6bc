#!/usr/bin/env bash
# Fetch, start and administer a RocketMQ 5 name server + proxy (local mode: the broker runs inside
# the proxy's JVM) on loopback for the test suite, next to the 4.9.7 of scripts/rocketmq.sh.
# Nothing of RocketMQ lives in the repo: the jars come from Maven Central into a cache folder.
#
# usage: scripts/rocketmq5.sh COMMAND [ARGS...]
#
#   fetch                  apt-get install a JRE and Maven when missing; copy the name server,
#                          broker, proxy and tools jars (and their dependencies) into the cache
#   start                  fetch, write configs, start the name server and the proxy (with its
#                          embedded broker) in the background, wait (bounded) until the broker
#                          is registered and the proxy answers, then create the standing topics
#                          and groups below; a no-op when up. Both JVMs run with
#                          scripts/loopback_bind.c preloaded (the proxy's gRPC and remoting
#                          servers have no bind-address setting)
#   stop                   stop the proxy and the name server started from this cache (by pid)
#   status                 say what runs; exit 0 when everything answers
#   topic NAME [QUEUES] [TYPE]  create or update a topic (default 4 queues) of a 5.x message
#                          type: NORMAL (default), FIFO, DELAY, TRANSACTION or MIXED (accepts
#                          all; the type of a topic that gets both delayed and immediate sends)
#   fifo-topic NAME [QUEUES]  the same as `topic NAME QUEUES FIFO` (ordered for remoting clients too)
#   group GROUP [RETRIES] [fifo]  create or update a consumer group with retryMaxTimes=RETRIES
#                          (default 2); `fifo` makes it an orderly (FIFO) group
#   admin ARGS...          run `mqadmin ARGS...` (-n is added when ARGS do not name a server)
#
# Standing topics and groups (created by start): ckit_smoke (NORMAL), ckit_smoke_fifo (FIFO),
#   ckit_smoke_mixed (MIXED), groups ckit_smoke_group and ckit_smoke_fifo_group (FIFO).
#
# Ports (all on 127.0.0.1, none shared with 4.9.7's 9876/10909/10911/10912), by default:
#   name server 9886; broker 10951 (+ 10949 fast channel, 10952 HA); proxy gRPC 8081, remoting 8082.
#
# Environment:
#   CKIT_CACHE                cache root (default ~/.cache/consumer-kit)
#   CKIT_ROCKETMQ5_VERSION    RocketMQ version (default 5.3.3)
#   CKIT_ROCKETMQ5_TIMEOUT    seconds to wait for start/stop (default 150)
#   CKIT_ROCKETMQ5_DELAYS     messageDelayLevel for remoting clients (default eighteen `1s`)
#   CKIT_ROCKETMQ5_RUN        run folder (default $CKIT_CACHE/rocketmq5-run); a folder given here
#                             also holds its own conf/ (ROCKETMQ_HOME), so a second name server +
#                             proxy (e.g. the fault runner's, bench/faults) shares only the jars
#   CKIT_ROCKETMQ5_NAMESRV_PORT        name server port (default 9886)
#   CKIT_ROCKETMQ5_BROKER_PORT         broker listenPort (default 10951; it also takes PORT-2 and
#                                      PORT+1)
#   CKIT_ROCKETMQ5_PROXY_PORT          proxy gRPC port (default 8081)
#   CKIT_ROCKETMQ5_PROXY_REMOTING_PORT proxy remoting port (default 8082)
#
# Layout: $CKIT_CACHE/rocketmq-VERSION/{lib,conf5} (ROCKETMQ_HOME; lib shared with nobody: 4.9.7
#         has its own folder), $CKIT_CACHE/loopback-bind/SHA.so (shared with scripts/rocketmq.sh)
#         and $CKIT_CACHE/rocketmq5-run/{store,logs,*.pid,*.out} (the JVMs' user.home); with
#         CKIT_ROCKETMQ5_RUN the configs are in RUN/conf and RUN is ROCKETMQ_HOME too.
set -euo pipefail

readonly VERSION=${CKIT_ROCKETMQ5_VERSION:-5.3.3}
readonly CACHE=${CKIT_CACHE:-$HOME/.cache/consumer-kit}
readonly RMQ_HOME=${CACHE}/rocketmq-${VERSION}
readonly LIB=${RMQ_HOME}/lib
readonly RUN=${CKIT_ROCKETMQ5_RUN:-${CACHE}/rocketmq5-run}
# The configs name the run folder and the ports: a run folder of its own gets its own configs.
if [[ -n ${CKIT_ROCKETMQ5_RUN:-} ]]; then
  readonly HOME_DIR=${RUN}
  readonly CONF=${RUN}/conf
else
  readonly HOME_DIR=${RMQ_HOME}
  readonly CONF=${RMQ_HOME}/conf5
fi
readonly NAMESRV_PORT=${CKIT_ROCKETMQ5_NAMESRV_PORT:-9886}
readonly BROKER_PORT=${CKIT_ROCKETMQ5_BROKER_PORT:-10951}
readonly PROXY_PORT=${CKIT_ROCKETMQ5_PROXY_PORT:-8081}
readonly PROXY_REMOTING_PORT=${CKIT_ROCKETMQ5_PROXY_REMOTING_PORT:-8082}
readonly NAMESRV_ADDR=127.0.0.1:${NAMESRV_PORT}
readonly CLUSTER=DefaultCluster
readonly BROKER_NAME=broker5-a
readonly TIMEOUT=${CKIT_ROCKETMQ5_TIMEOUT:-150}
SHIM_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/loopback_bind.c
readonly SHIM_SRC
readonly DELAYS=${CKIT_ROCKETMQ5_DELAYS:-1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s}

# 5.x still cleans mapped buffers through JDK internals that JDK 17 closes.
readonly JAVA_OPENS=(
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED
)
readonly JAVA_COMMON=(
  "${JAVA_OPENS[@]}"
  -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow -Djava.net.preferIPv4Stack=true
  "-Drocketmq.home.dir=${HOME_DIR}" "-Duser.home=${RUN}"
  -Drocketmq.broker.diskSpaceWarningLevelRatio=0.98
)

LOG_TAG=rocketmq5
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------------- fetch

write_pom() {
  mkdir -p "${RMQ_HOME}"
  local artifact deps=""
  for artifact in rocketmq-namesrv rocketmq-broker rocketmq-proxy rocketmq-tools; do
    deps+="    <dependency>
      <groupId>org.apache.rocketmq</groupId><artifactId>${artifact}</artifactId>
      <version>${VERSION}</version>
    </dependency>
"
  done
  cat >"${RMQ_HOME}/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by consumer-kit scripts/rocketmq5.sh: only used to copy RocketMQ's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>consumer-kit</groupId>
  <artifactId>rocketmq5-runtime</artifactId>
  <version>${VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
${deps}  </dependencies>
</project>
EOF
}

fetch() {
  if [[ -f ${LIB}/.complete ]]; then
    return 0
  fi
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null || apt_install maven
  write_pom
  log "fetching RocketMQ ${VERSION} jars from Maven Central into ${LIB}"
  rm -rf "${LIB}.tmp"
  (cd "${RMQ_HOME}" && mvn -B -q -f pom.xml dependency:copy-dependencies \
    -DoutputDirectory="${LIB}.tmp" -DincludeScope=runtime) >&2 \
    || die "mvn dependency:copy-dependencies failed (see above)"
  local jar
  for jar in broker proxy namesrv tools; do
    [[ -f ${LIB}.tmp/rocketmq-${jar}-${VERSION}.jar ]] \
      || die "rocketmq-${jar}-${VERSION}.jar missing after the copy"
  done
  rm -rf "${LIB}"
  mv "${LIB}.tmp" "${LIB}"
  touch "${LIB}/.complete"
  log "fetched $(find "${LIB}" -name '*.jar' | wc -l) jars"
}

# Build the loopback-only bind shim (once per source version; the same file as rocketmq.sh's)
# and print its path.
build_shim() {
  local sha so
  sha=$(sha256sum "${SHIM_SRC}" | cut -c1-16)
  so=${CACHE}/loopback-bind/${sha}.so
  if [[ ! -f $so ]]; then
    command -v gcc >/dev/null || apt_install gcc libc6-dev
    mkdir -p "${CACHE}/loopback-bind"
    gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "${so}.tmp.$$" "${SHIM_SRC}" -ldl >&2 \
      || die "could not build ${SHIM_SRC} with gcc"
    mv "${so}.tmp.$$" "${so}"
  fi
  echo "${so}"
}

# -------------------------------------------------------------------------------------- configs

write_configs() {
  mkdir -p "${CONF}" "${RUN}/logs" "${RUN}/store"
  cat >"${CONF}/broker.conf" <<EOF
# Generated by consumer-kit scripts/rocketmq5.sh: a small test broker on loopback, run inside
# the proxy (local mode).
brokerClusterName=${CLUSTER}
brokerName=${BROKER_NAME}
brokerId=0
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH
listenPort=${BROKER_PORT}
haListenPort=$((BROKER_PORT + 1))
namesrvAddr=${NAMESRV_ADDR}
brokerIP1=127.0.0.1
storePathRootDir=${RUN}/store
storePathCommitLog=${RUN}/store/commitlog
autoCreateTopicEnable=true
autoCreateSubscriptionGroup=true
defaultTopicQueueNums=4
mappedFileSizeCommitLog=67108864
mappedFileSizeConsumeQueue=600000
mappedFileSizeTimerLog=16777216
timerMaxDelaySec=86400
maxHashSlotNum=10000
maxIndexNum=40000
diskMaxUsedSpaceRatio=95
fileReservedTime=24
messageDelayLevel=${DELAYS}
# MIXED topics take normal, delayed and ordered sends alike (the harness uses them).
enableMixedMessageType=true
EOF
  # Test speed: receive may ask for an invisible time down to 1 s (production minimum: 10 s),
  # and a stopping proxy waits at most 3 s for in-flight gRPC calls (default 30 s).
  cat >"${CONF}/rmq-proxy.json" <<EOF
{
  "rocketMQClusterName": "${CLUSTER}",
  "proxyMode": "local",
  "namesrvAddr": "${NAMESRV_ADDR}",
  "grpcServerPort": ${PROXY_PORT},
  "remotingListenPort": ${PROXY_REMOTING_PORT},
  "brokerConfigPath": "${CONF}/broker.conf",
  "minInvisibleTimeMillsForRecv": 1000,
  "grpcShutdownTimeSeconds": 3,
  "enablePrintJstack": false
}
EOF
}

# ------------------------------------------------------------------------------------ processes

# True when the pid file names a live JVM of ours: the pid runs the main class of that file's
# name with this run folder as user.home. A stale file after a reboot or on a copied machine may
# name a pid that another process got since (even the other RocketMQ's JVM): that is not ours,
# so `start` launches a fresh one and `stop` never signals it.
pid_alive() {
  local file=$1 pid class cmdline
  [[ -f $file ]] || return 1
  case $(basename "$file" .pid) in
    namesrv) class=org.apache.rocketmq.namesrv.NamesrvStartup ;;
    broker) class=org.apache.rocketmq.broker.BrokerStartup ;;
    proxy) class=org.apache.rocketmq.proxy.ProxyStartup ;;
    *) return 1 ;;
  esac
  pid=$(<"$file")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  cmdline=$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null) || return 1
  [[ " ${cmdline} " == *" -Duser.home=${RUN} "* && " ${cmdline} " == *" ${class} "* ]]
}

# True while a process we just launched runs (by /proc state: right after `nohup java &` its
# cmdline may still be this bash's, and an exited child stays a zombie until reaped).
launched_alive() {
  local file=$1 pid state
  [[ -f $file ]] || return 1
  pid=$(<"$file")
  [[ -r /proc/${pid}/stat ]] || return 1
  state=$(sed 's/.*) //' "/proc/${pid}/stat" 2>/dev/null | cut -d' ' -f1)
  [[ -n $state && $state != Z && $state != X ]]
}

console_tail() {
  local out=$1
  if [[ -s $out ]]; then
    tail -5 "$out"
  else
    echo "(no output in ${out}; see ${RUN}/logs/rocketmqlogs)"
  fi
}

mqadmin() {
  java "${JAVA_COMMON[@]}" -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto \
    -Drmq.logback.configurationFile=rmq.tools.logback.xml \
    -cp "${LIB}/*" org.apache.rocketmq.tools.command.MQAdminStartup "$@"
}

broker_registered() {
  mqadmin clusterList -n "${NAMESRV_ADDR}" 2>/dev/null | grep -q "${BROKER_NAME}"
}

wait_for_up() {
  wait_until "$@" || die "timed out waiting for $1 (logs in ${RUN}/logs and ${RUN}/*.out)"
}

# launch NAME PORT JVM_OPTIONS... MAIN_CLASS ARGS...: start one JVM in the background (a no-op
# when ours runs), with the loopback shim preloaded, its console in $RUN/NAME.out and its pid in
# $RUN/NAME.pid.
launch() {
  local name=$1 port=$2
  shift 2
  if pid_alive "${RUN}/${name}.pid"; then
    return 0
  fi
  port_open "${port}" && die "port ${port} is taken by another process"
  log "starting ${name} on 127.0.0.1:${port}"
  LD_PRELOAD=${SHIM} nohup java "${JAVA_COMMON[@]}" -server -cp "${LIB}/*" "$@" \
    >"${RUN}/${name}.out" 2>&1 </dev/null &
  echo $! >"${RUN}/${name}.pid"
}

start_namesrv() {
  launch namesrv "${NAMESRV_PORT}" -Xms128m -Xmx256m -Xmn64m \
    -Drmq.logback.configurationFile=rmq.namesrv.logback.xml \
    org.apache.rocketmq.namesrv.NamesrvStartup -c "${CONF}/namesrv.conf"
}

# The broker (each pop read takes a 4 MiB direct buffer) and the proxy's gRPC share the direct
# memory: 256 MiB ran out under the test suite (OutOfMemoryError in pop, messages not delivered).
start_proxy() {
  launch proxy "${PROXY_PORT}" -Xms1g -Xmx1g -Xmn384m -XX:MaxDirectMemorySize=1g \
    -Drmq.logback.configurationFile=rmq.proxy.logback.xml \
    org.apache.rocketmq.proxy.ProxyStartup -pm local -pc "${CONF}/rmq-proxy.json" \
    -bc "${CONF}/broker.conf" -n "${NAMESRV_ADDR}"
}

namesrv_up() {
  launched_alive "${RUN}/namesrv.pid" \
    || die "name server exited: $(console_tail "${RUN}/namesrv.out")"
  grep -q 'The Name Server boot success' "${RUN}/namesrv.out" 2>/dev/null \
    && port_open "${NAMESRV_PORT}"
}

proxy_up() {
  launched_alive "${RUN}/proxy.pid" || die "proxy exited: $(console_tail "${RUN}/proxy.out")"
  grep -q 'rocketmq-proxy startup successfully' "${RUN}/proxy.out" 2>/dev/null \
    && port_open "${PROXY_PORT}" && port_open "${BROKER_PORT}"
}

all_up() {
  pid_alive "${RUN}/namesrv.pid" && pid_alive "${RUN}/proxy.pid" \
    && port_open "${NAMESRV_PORT}" && port_open "${BROKER_PORT}" && port_open "${PROXY_PORT}"
}

create_standing() {
  log "creating the standing topics and groups"
  update_topic ckit_smoke 4 NORMAL
  update_topic ckit_smoke_fifo 4 FIFO
  update_topic ckit_smoke_mixed 4 MIXED
  update_group ckit_smoke_group 2
  update_group ckit_smoke_fifo_group 2 fifo
  touch "${RUN}/.standing"
}

start() {
  if all_up; then
    [[ -f ${RUN}/.standing ]] || create_standing
    log "already running (name server ${NAMESRV_ADDR}, proxy 127.0.0.1:${PROXY_PORT})"
    return 0
  fi
  fetch
  write_configs
  # The name server's defaults (port 9876) are overridden here.
  printf 'listenPort=%s\n' "${NAMESRV_PORT}" >"${CONF}/namesrv.conf"
  SHIM=$(build_shim)
  rm -f "${RUN}/.standing"
  local began=${SECONDS} deadline=$((SECONDS + TIMEOUT))
  start_namesrv
  wait_for_up "the name server" "${deadline}" namesrv_up
  start_proxy
  wait_for_up "the proxy and its broker" "${deadline}" proxy_up
  wait_for_up "the broker to register with the name server" "${deadline}" broker_registered
  create_standing
  log "up in $((SECONDS - began)) s (name server ${NAMESRV_ADDR}, broker 127.0.0.1:${BROKER_PORT}," \
    "proxy gRPC 127.0.0.1:${PROXY_PORT})"
}

stop_one() {
  local name=$1 file="${RUN}/$1.pid" pid deadline=$((SECONDS + TIMEOUT))
  if ! pid_alive "$file"; then
    rm -f "$file"
    return 0
  fi
  pid=$(<"$file")
  log "stopping ${name} (pid ${pid})"
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "${name} did not stop in ${TIMEOUT} s; killing it"
      kill -9 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.3
  done
  rm -f "$file"
}

stop() {
  stop_one proxy
  stop_one namesrv
}

status() {
  local rc=0 name port
  for name in namesrv proxy; do
    [[ $name == namesrv ]] && port=${NAMESRV_PORT} || port=${PROXY_PORT}
    if pid_alive "${RUN}/${name}.pid" && port_open "${port}"; then
      log "${name}: up (pid $(<"${RUN}/${name}.pid"), 127.0.0.1:${port})"
    else
      log "${name}: down"; rc=1
    fi
  done
  if port_open "${BROKER_PORT}"; then
    log "broker (inside the proxy): up (127.0.0.1:${BROKER_PORT})"
  else
    log "broker (inside the proxy): down"; rc=1
  fi
  return "$rc"
}

# ---------------------------------------------------------------------------------------- admin

admin() {
  [[ -f ${LIB}/.complete ]] || die "RocketMQ ${VERSION} is not fetched: run scripts/rocketmq5.sh start"
  mkdir -p "${RUN}/logs"
  local arg
  for arg in "$@"; do
    if [[ $arg == -n || $arg == --namesrvAddr ]]; then
      mqadmin "$@"
      return
    fi
  done
  mqadmin "$@" -n "${NAMESRV_ADDR}"
}

# update_topic NAME QUEUES TYPE: TYPE is a 5.x message.type (NORMAL, FIFO, DELAY, TRANSACTION);
# FIFO topics are also marked ordered for remoting clients.
update_topic() {
  local order=false
  [[ $3 == FIFO ]] && order=true
  admin updateTopic -c "${CLUSTER}" -t "$1" -r "$2" -w "$2" -o "${order}" \
    -a "+message.type=$3" >/dev/null || die "could not create topic $1"
}

# update_group GROUP RETRIES [fifo]
update_group() {
  local orderly=false
  [[ ${3:-} == fifo ]] && orderly=true
  admin updateSubGroup -c "${CLUSTER}" -g "$1" -r "$2" -o "${orderly}" >/dev/null \
    || die "could not create group $1"
}

main() {
  local cmd=${1:-}
  shift || true
  case "$cmd" in
    fetch) fetch ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    topic)
      (($# >= 1 && $# <= 3)) || die "usage: $0 topic NAME [QUEUES] [TYPE]"
      case ${3:-NORMAL} in
        NORMAL | FIFO | DELAY | TRANSACTION | MIXED) ;;
        *) die "unknown message type ${3}: use NORMAL, FIFO, DELAY, TRANSACTION or MIXED" ;;
      esac
      update_topic "$1" "${2:-4}" "${3:-NORMAL}" ;;
    fifo-topic)
      (($# >= 1 && $# <= 2)) || die "usage: $0 fifo-topic NAME [QUEUES]"
      update_topic "$1" "${2:-4}" FIFO ;;
    group)
      (($# >= 1 && $# <= 3)) || die "usage: $0 group GROUP [RETRIES] [fifo]"
      [[ -z ${3:-} || ${3} == fifo ]] || die "usage: $0 group GROUP [RETRIES] [fifo]"
      update_group "$1" "${2:-2}" "${3:-}" ;;
    admin) admin "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
