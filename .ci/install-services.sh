#!/usr/bin/env bash
# Installs the real services exactly's tests start through exactly-testkit:
# PostgreSQL (initdb/pg_ctl/postgres), redis-server and the Nisshi broker.
# Idempotent: installs only what is missing. Safe to run on every CI run.
# Without PostgreSQL or Nisshi, the testkit uses Docker containers instead
# when an engine answers (see EXACTLY_TESTKIT_DOCKER in crates/testkit).
set -euo pipefail

NISSHI_VERSION="0.7.0-pre.2"
NISSHI_FEATURES="dynostore,libsql"

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

have_redis() {
    command -v redis-server >/dev/null 2>&1
}

have_nisshi() {
    command -v nisshi >/dev/null 2>&1 \
        || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/nisshi" ] \
        || [ -x "$HOME/.cargo/bin/nisshi" ]
}

packages=()
if have_postgres; then
    log "PostgreSQL binaries present, skipping"
else
    packages+=(postgresql)
fi
if have_redis; then
    log "redis-server present, skipping"
else
    packages+=(redis-server)
fi
if ! command -v psql >/dev/null 2>&1 && [[ ! " ${packages[*]-} " == *" postgresql "* ]]; then
    packages+=(postgresql-client)
fi

if [ "${#packages[@]}" -gt 0 ]; then
    log "apt-get update"
    as_root apt-get update
    log "apt-get install -y ${packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${packages[@]}"
fi

if have_nisshi; then
    log "nisshi present, skipping"
else
    log "cargo install nisshi --version $NISSHI_VERSION --locked --features $NISSHI_FEATURES (takes a while)"
    cargo install nisshi --version "$NISSHI_VERSION" --locked --features "$NISSHI_FEATURES"
fi

log "done"
