#!/usr/bin/env bash
# The PostgreSQL binaries the `postgres` backend's tests run (testkit/src/pg.rs starts its
# own clusters with them: initdb into a temporary directory, a private loopback port).
#
#   tools/pg.sh install   installs Debian's `postgresql` package when no binaries are
#                         found (apt-get, as root or through sudo), then prints the bin dir
#   tools/pg.sh bin       prints the bin dir, or exits 1 when there is none
#
# The bin dir is found as the tests find it: $OPJOURNAL_PG_BIN, else the highest
# /usr/lib/postgresql/<version>/bin, else the directory of the `initdb` on PATH. Only the
# bin dir goes to stdout, so `export OPJOURNAL_PG_BIN=$(tools/pg.sh install)` works.
#
# The package's own cluster (`main`, port 5432) is not used. A policy-rc.d that refuses
# every service start is in place during the install, so it is not started either.
set -euo pipefail

has_binaries() {
    local name
    for name in initdb pg_ctl postgres psql; do
        [ -f "$1/$name" ] || return 1
    done
}

bin_dir() {
    if [ -n "${OPJOURNAL_PG_BIN:-}" ]; then
        if has_binaries "$OPJOURNAL_PG_BIN"; then
            echo "$OPJOURNAL_PG_BIN"
            return 0
        fi
        echo "pg.sh: OPJOURNAL_PG_BIN=$OPJOURNAL_PG_BIN lacks initdb, pg_ctl, postgres or psql" >&2
        return 1
    fi
    local dir
    # Version directories, highest first (15 before 9.6).
    if [ -d /usr/lib/postgresql ]; then
        while read -r dir; do
            if has_binaries "/usr/lib/postgresql/$dir/bin"; then
                echo "/usr/lib/postgresql/$dir/bin"
                return 0
            fi
        done < <(ls /usr/lib/postgresql | sort -t. -k1,1nr -k2,2nr)
    fi
    if command -v initdb >/dev/null; then
        dir=$(dirname "$(readlink -f "$(command -v initdb)")")
        if has_binaries "$dir"; then
            echo "$dir"
            return 0
        fi
    fi
    return 1
}

install() {
    if [ -n "${OPJOURNAL_PG_BIN:-}" ] || bin_dir >/dev/null 2>&1; then
        bin_dir
        return
    fi
    if ! command -v apt-get >/dev/null; then
        echo "pg.sh: no PostgreSQL binaries and no apt-get: install PostgreSQL's server and set OPJOURNAL_PG_BIN to its bin directory" >&2
        return 1
    fi
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        sudo=(sudo)
    fi
    echo "pg.sh: installing Debian's postgresql package" >&2
    # No service starts during the install (101: action forbidden), unless a policy
    # is already there (containers often have one).
    local policy=/usr/sbin/policy-rc.d added_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        added_policy=1
    fi
    local status=0
    {
        "${sudo[@]}" apt-get update -qq &&
            "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -qq --no-install-recommends postgresql
    } >&2 || status=$?
    if [ -n "$added_policy" ]; then
        "${sudo[@]}" rm -f "$policy"
    fi
    if [ "$status" != 0 ]; then
        echo "pg.sh: apt-get failed ($status)" >&2
        return "$status"
    fi
    bin_dir
}

case "${1:-}" in
    install) install ;;
    bin) bin_dir ;;
    *)
        echo "usage: tools/pg.sh install | bin" >&2
        exit 2
        ;;
esac
