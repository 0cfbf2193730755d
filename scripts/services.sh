#!/usr/bin/env bash
# Brings up the services the tests need on 127.0.0.1 when they are down:
# PostgreSQL (5432), RabbitMQ (5672), MariaDB (3306) and Redis (6379). Installs a package with
# apt-get only when it is absent. Kafka needs no service: tests run an in-process cluster.
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

if ! up 3306; then
	echo "services: starting MariaDB"
	command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server
	install -d -o mysql -g mysql /run/mysqld
	[ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
	start-stop-daemon --start --oknodo --background --chuid mysql --exec /usr/sbin/mariadbd
	wait_port 3306
fi
# The tests connect as root over TCP without a password (as PostgreSQL's
# trust): root on the socket (unix_socket auth) makes sure that user and the
# test database exist.
if command -v mariadb >/dev/null; then
	mariadb -uroot -h127.0.0.1 -e "SELECT 1" >/dev/null 2>&1 ||
		mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"
	mariadb -uroot -h127.0.0.1 -e "CREATE DATABASE IF NOT EXISTS test"
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
	echo "services: starting Redis"
	command -v redis-server >/dev/null || apt_install redis-server
	redis-server --daemonize yes --bind 127.0.0.1 --port 6379
	for _ in $(seq 1 120); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.5; done
	redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "services: redis did not answer" >&2; exit 1; }
fi

# Chromium for the console's browser test (it skips without one).
bash "$(dirname "$0")/chromium.sh"
