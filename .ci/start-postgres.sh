#!/usr/bin/env bash
# Start PostgreSQL 15 on loopback for the store's contract tests; idempotent, run as root.
# Prints the URL to export as TUNER_TEST_PG_URL (or pass to `tuner --db`).
set -euo pipefail

PG_VERSION=15
PG_CLUSTER=main
ROLE=tuner
PASSWORD=tuner
DB=tuner
URL="postgresql+psycopg://${ROLE}:${PASSWORD}@127.0.0.1:5432/${DB}"

if [[ $(id -u) -ne 0 ]]; then
    echo "start-postgres.sh: run as root (it installs and starts PostgreSQL)" >&2
    exit 1
fi

if ! command -v pg_ctlcluster >/dev/null || [[ ! -d /usr/lib/postgresql/${PG_VERSION} ]]; then
    echo "installing postgresql ${PG_VERSION} ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
fi

if ! pg_lsclusters --no-header | awk '{print $1, $2}' | grep -qx "${PG_VERSION} ${PG_CLUSTER}"; then
    pg_createcluster "${PG_VERSION}" "${PG_CLUSTER}" >&2
fi

if ! pg_lsclusters --no-header | awk -v v="${PG_VERSION}" -v c="${PG_CLUSTER}" '$1==v && $2==c {print $4}' | grep -q online; then
    pg_ctlcluster "${PG_VERSION}" "${PG_CLUSTER}" start
fi

# Wait until the server accepts connections (up to 30 s).
for _ in $(seq 1 60); do
    if su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432"; then break; fi
    sleep 0.5
done
su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432" || {
    echo "start-postgres.sh: PostgreSQL did not come up; see /var/log/postgresql/postgresql-${PG_VERSION}-${PG_CLUSTER}.log" >&2
    exit 1
}

psql_q() { su postgres -c "psql -qtAX -c \"$1\""; }

if [[ -z $(psql_q "SELECT 1 FROM pg_roles WHERE rolname = '${ROLE}'") ]]; then
    psql_q "CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'" >&2
fi
if [[ -z $(psql_q "SELECT 1 FROM pg_database WHERE datname = '${DB}'") ]]; then
    su postgres -c "createdb -O ${ROLE} ${DB}" >&2
fi

# Up means usable: the tests' own login (password over TCP on loopback) answers.
if [[ $(PGPASSWORD="${PASSWORD}" psql -h 127.0.0.1 -p 5432 -U "${ROLE}" -d "${DB}" -qtAX -c 'SELECT 1' 2>&1) != 1 ]]; then
    echo "start-postgres.sh: PostgreSQL is up but ${ROLE}@127.0.0.1/${DB} cannot log in with its password;" \
         "see /etc/postgresql/${PG_VERSION}/${PG_CLUSTER}/pg_hba.conf" >&2
    exit 1
fi

echo "${URL}"
