#!/usr/bin/env bash
# Brings up the services the tests need on 127.0.0.1 when they are down:
# PostgreSQL (5432) and RabbitMQ (5672). Installs a package with apt-get only
# when it is absent. Kafka needs no service: tests run an in-process cluster.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
	for _ in $(seq 1 120); do up "$1" && return 0; sleep 0.5; done
	echo "services: port $1 did not open" >&2
	return 1
}

apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
}

if ! up 5432; then
	echo "services: starting PostgreSQL"
	command -v pg_ctlcluster >/dev/null || apt_install postgresql
	ver=$(ls /etc/postgresql | sort -V | tail -n 1)
	pg_ctlcluster --skip-systemctl-redirect "$ver" main start
	wait_port 5432
fi
# Trust auth on 127.0.0.1 is what the machine ships; make sure the test
# database exists.
if command -v psql >/dev/null; then
	psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" postgres 2>/dev/null | grep -q 1 ||
		psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" postgres >/dev/null
fi

if ! up 5672; then
	echo "services: starting RabbitMQ"
	command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
	rabbitmq-server -detached
	rabbitmqctl await_startup >/dev/null 2>&1 || true
	wait_port 5672
fi

# Chromium for the console's browser test (it skips without one).
bash "$(dirname "$0")/chromium.sh"
