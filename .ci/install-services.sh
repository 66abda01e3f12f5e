#!/usr/bin/env bash
# Installs the real services exactly's tests and demo start through
# exactly-testkit: PostgreSQL (initdb/pg_ctl/postgres) and redis-server from
# Debian's packages, and Apache Kafka's broker jars from Maven Central; and
# OpenSSL's headers, which the build of rdkafka (with TLS) needs.
#
# Idempotent: installs only what is missing, and takes a second when
# everything is there. Safe to run on every CI run.
#
# The Kafka jars (org.apache.kafka:kafka_2.13 and its dependencies, plus the
# log4j SLF4J binding the release tarball adds) go to
#   ${EXACTLY_KAFKA_LIBS:-${XDG_CACHE_HOME:-~/.cache}/exactly/kafka-<version>/libs}
# (the version is the one in crates/testkit/kafka/pom.xml). Any tool can start
# the same broker from there:
#   java -cp "$EXACTLY_KAFKA_LIBS/*" kafka.tools.StorageTool format --standalone -t <id> -c server.properties
#   java -cp "$EXACTLY_KAFKA_LIBS/*" kafka.Kafka server.properties
#
# The schema registry (Apicurio Registry, whose Confluent-compatible API is
# at /apis/ccompat/v7) is the runnable distribution
# io.apicurio:apicurio-registry-app:<version>:tar.gz:all from Maven Central,
# unpacked into
#   ${EXACTLY_SCHEMA_REGISTRY_HOME:-${XDG_CACHE_HOME:-~/.cache}/exactly/apicurio-registry-<version>}
# and started (in-memory storage) with
#   java -Dquarkus.http.port=8081 -Dquarkus.http.host=127.0.0.1 -jar apicurio-registry-app-<version>-runner.jar
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[install-services] $*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root for: $* (no sudo found)"
        return 1
    fi
}

have_postgres() {
    if command -v initdb >/dev/null 2>&1; then
        return 0
    fi
    local bin
    for bin in /usr/lib/postgresql/*/bin/initdb; do
        [ -x "$bin" ] && return 0
    done
    return 1
}

have_java() {
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
        return 0
    fi
    command -v java >/dev/null 2>&1
}

packages=()
if have_postgres; then
    log "PostgreSQL binaries present, skipping"
else
    packages+=(postgresql)
fi
if command -v redis-server >/dev/null 2>&1; then
    log "redis-server present, skipping"
else
    packages+=(redis-server)
fi
# tests/workers.rs cuts a worker off the network in a namespace of its own
# (`ip netns`).
if command -v ip >/dev/null 2>&1; then
    log "ip (iproute2) present, skipping"
else
    packages+=(iproute2)
fi
if ! command -v psql >/dev/null 2>&1 && [[ ! " ${packages[*]-} " == *" postgresql "* ]]; then
    packages+=(postgresql-client)
fi
# rdkafka is built with TLS against the system's OpenSSL (librdkafka's
# build finds it through pkg-config).
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; then
    log "OpenSSL headers present, skipping"
else
    packages+=(libssl-dev pkg-config)
fi
if have_java; then
    log "java present, skipping"
else
    packages+=(openjdk-17-jre-headless)
fi

pom=crates/testkit/kafka/pom.xml
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
[ -n "$kafka_version" ] || { log "no <kafka.version> in $pom"; exit 1; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}
libs=${EXACTLY_KAFKA_LIBS:-$cache/exactly/kafka-$kafka_version/libs}
# Written last, so a copy interrupted half-way is done again.
complete="$libs/.exactly-complete"
need_jars=1
[ -f "$complete" ] && [ -f "$libs/kafka_2.13-$kafka_version.jar" ] && need_jars=0
if [ -n "${EXACTLY_KAFKA_LIBS:-}" ] && [ "$need_jars" = 1 ]; then
    # A folder of the user's: use any Kafka it holds, never replace it.
    if ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
        need_jars=0
    elif [ -n "$(ls -A "$libs" 2>/dev/null)" ]; then
        log "EXACTLY_KAFKA_LIBS=$libs holds no kafka_2.13-*.jar but is not empty: point it at a Kafka libs/ folder, at an empty folder, or unset it"
        exit 1
    fi
fi
# Apicurio Registry 3.0.x runs on Java 17 (3.3.x needs 21+); the version is
# the one crates/testkit/src/schema_registry/install.rs names.
apicurio_version=3.0.9
registry_home=${EXACTLY_SCHEMA_REGISTRY_HOME:-$cache/exactly/apicurio-registry-$apicurio_version}
registry_jar="$registry_home/apicurio-registry-app-$apicurio_version-runner.jar"
registry_complete="$registry_home/.exactly-complete"
need_registry=1
if [ -f "$registry_jar" ] && { [ -f "$registry_complete" ] || [ -n "${EXACTLY_SCHEMA_REGISTRY_HOME:-}" ]; }; then
    need_registry=0
elif [ -n "${EXACTLY_SCHEMA_REGISTRY_HOME:-}" ] && [ -n "$(ls -A "$registry_home" 2>/dev/null)" ]; then
    log "EXACTLY_SCHEMA_REGISTRY_HOME=$registry_home holds no apicurio-registry-app-$apicurio_version-runner.jar but is not empty: point it at an unpacked distribution, at an empty folder, or unset it"
    exit 1
fi
if { [ "$need_jars" = 1 ] || [ "$need_registry" = 1 ]; } && ! command -v mvn >/dev/null 2>&1; then
    packages+=(maven)
fi

if [ "${#packages[@]}" -gt 0 ]; then
    log "apt-get update"
    as_root apt-get update
    log "apt-get install -y ${packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
fi

if [ "$need_jars" = 1 ]; then
    log "fetching Apache Kafka $kafka_version jars with Maven (about a minute the first time)"
    staging="$libs.partial"
    rm -rf "$staging"
    mkdir -p "$staging"
    mvn -B -q -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$staging"
    [ -f "$staging/kafka_2.13-$kafka_version.jar" ] || { log "Maven copied no kafka_2.13-$kafka_version.jar"; exit 1; }
    ls "$staging"/log4j-slf4j-impl-*.jar >/dev/null 2>&1 || { log "Maven copied no log4j-slf4j-impl jar"; exit 1; }
    rm -rf "$libs"
    mv "$staging" "$libs"
    touch "$complete"
else
    log "Apache Kafka $kafka_version jars present, skipping"
fi
log "Kafka broker jars: $libs (override with EXACTLY_KAFKA_LIBS)"

if [ "$need_registry" = 1 ]; then
    log "fetching Apicurio Registry $apicurio_version (io.apicurio:apicurio-registry-app:$apicurio_version:tar.gz:all, 104 MB) with Maven and unpacking it into $registry_home"
    staging="$registry_home.partial"
    rm -rf "$staging"
    mkdir -p "$staging/download"
    mvn -B -q -Dstyle.color=never dependency:copy \
        -Dartifact="io.apicurio:apicurio-registry-app:$apicurio_version:tar.gz:all" \
        -DoutputDirectory="$staging/download"
    tar -xzf "$staging/download/apicurio-registry-app-$apicurio_version-all.tar.gz" -C "$staging"
    rm -rf "$staging/download"
    [ -f "$staging/apicurio-registry-app-$apicurio_version-runner.jar" ] || { log "the distribution holds no apicurio-registry-app-$apicurio_version-runner.jar"; exit 1; }
    rm -rf "$registry_home"
    mv "$staging" "$registry_home"
    touch "$registry_complete"
else
    log "Apicurio Registry $apicurio_version present, skipping"
fi
log "schema registry: $registry_jar (override with EXACTLY_SCHEMA_REGISTRY_HOME)"

log "done"
