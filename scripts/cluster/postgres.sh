#!/usr/bin/env bash
# A PostgreSQL primary and a streaming replica on 127.0.0.1, for the failover
# faults of internal/clusterfault. Separate from the machine's server on 5432,
# which this script never touches.
#
#   postgres.sh up [async|sync]  primary on 5441, hot standby on 5442 streaming
#                                from it through a replication slot; sync makes
#                                the standby synchronous (synchronous_commit=on)
#   postgres.sh pause-wal        stop the primary's walsender (SIGSTOP): the
#                                standby falls behind, as on a slow link
#   postgres.sh kill-primary     kill -9 the primary's postmaster and children
#   postgres.sh cold-standby     restart the standby with hot_standby=off: it
#                                refuses every connection (57P03), as a standby
#                                does until it reaches a consistent state
#   postgres.sh promote          promote the standby (pg_ctl promote -w)
#   postgres.sh status           each node: running, primary or standby
#   postgres.sh down             stop both and remove their data
#
# up is idempotent: a pair of this work dir already streaming only has its
# mode set (a reload); anything else (a pair after a failover, a half-built
# one) is rebuilt. A server on either port that is not this work dir's
# (another run's pair) is never adopted nor stopped: up fails instead.
# Work dir: $IDEM_CLUSTER_DIR/postgres (default /tmp/idem-cluster/postgres);
# ports: IDEM_PG_PRIMARY_PORT and IDEM_PG_REPLICA_PORT. Two pairs at once
# need two work dirs and four ports; internal/clusterfault's smoke cases
# take free ports and a fresh dir, and its full suite holds a lock on
# /tmp/idem-cluster-postgres-<primary port>.lock while its pair is up.
set -euo pipefail

BIN=${IDEM_PG_BIN:-}
if [ -z "$BIN" ]; then
	BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi
WORK=${IDEM_CLUSTER_DIR:-/tmp/idem-cluster}/postgres
PRIMARY=$WORK/primary
REPLICA=$WORK/replica
PPORT=${IDEM_PG_PRIMARY_PORT:-5441}
RPORT=${IDEM_PG_REPLICA_PORT:-5442}
APP=idem_replica # the standby's application_name, named by synchronous_standby_names
SLOT=idem_replica

die() {
	echo "postgres.sh: $*" >&2
	exit 1
}

[ -n "$BIN" ] && [ -x "$BIN/initdb" ] || die "PostgreSQL server binaries not found (install postgresql, or set IDEM_PG_BIN)"

# as runs a command as the postgres OS user: the server refuses to run as root.
as() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

psql_at() { # port, sql
	as "$BIN/psql" -X -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -tAc "$2"
}

pid_of() { # data dir: the postmaster's pid, if it runs
	local f=$1/postmaster.pid pid
	[ -f "$f" ] || return 1
	pid=$(head -n 1 "$f")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

role_at() { # port: primary, standby or down
	case $(psql_at "$1" "SELECT pg_is_in_recovery()" 2>/dev/null || echo x) in
	f) echo primary ;;
	t) echo standby ;;
	*) echo down ;;
	esac
}

start() { # data dir, port
	as "$BIN/pg_ctl" -D "$1" -l "$1.log" -w -t 60 -o "-p $2" start >/dev/null
}

stop_node() { # data dir
	local pid
	if pid=$(pid_of "$1"); then
		as "$BIN/pg_ctl" -D "$1" -m immediate -w -t 30 stop >/dev/null 2>&1 || kill -9 "$pid" 2>/dev/null || true
	fi
}

set_mode() { # async|sync, on the primary
	local names=""
	[ "$1" = sync ] && names=$APP
	# synchronous_commit=on: a COMMIT returns once the standby has flushed
	# its WAL, so a promoted standby holds every acknowledged commit.
	# remote_apply would also wait for replay, which only readers of the
	# standby need; idem reads and writes on the primary alone.
	psql_at "$PPORT" "ALTER SYSTEM SET synchronous_standby_names = '$names'" >/dev/null
	psql_at "$PPORT" "ALTER SYSTEM SET synchronous_commit = 'on'" >/dev/null
	psql_at "$PPORT" "SELECT pg_reload_conf()" >/dev/null
	# The reload is asynchronous: wait until the setting is live.
	for _ in $(seq 1 100); do
		[ "$(psql_at "$PPORT" "SHOW synchronous_standby_names")" = "$names" ] && return 0
		sleep 0.05
	done
	die "synchronous_standby_names did not become '$names'"
}

ours() { # data dir, port: that data dir's postmaster runs, on that port
	pid_of "$1" >/dev/null && [ "$(sed -n 4p "$1/postmaster.pid")" = "$2" ]
}

streaming() { # this work dir's standby streams from its primary
	ours "$PRIMARY" "$PPORT" && ours "$REPLICA" "$RPORT" &&
		[ "$(role_at "$PPORT")" = primary ] && [ "$(role_at "$RPORT")" = standby ] &&
		[ "$(psql_at "$PPORT" "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$APP' AND state = 'streaming'")" = 1 ]
}

build() {
	down
	local port
	for port in "$PPORT" "$RPORT"; do
		[ "$(role_at "$port")" = down ] ||
			die "a server not of $WORK answers on 127.0.0.1:$port (another pair?): choose other ports with IDEM_PG_PRIMARY_PORT and IDEM_PG_REPLICA_PORT, and another dir with IDEM_CLUSTER_DIR"
	done
	install -d -o postgres -g postgres "$WORK"
	as "$BIN/initdb" -D "$PRIMARY" -U postgres --auth=trust --no-instructions >/dev/null
	cat >>"$PRIMARY/postgresql.conf" <<-EOF
		listen_addresses = '127.0.0.1'
		unix_socket_directories = '$WORK'
		wal_level = replica
		max_wal_senders = 4
		max_replication_slots = 4
		hot_standby = on
		wal_sender_timeout = 10s
		wal_receiver_timeout = 10s
		shared_buffers = 32MB
		max_connections = 60
		fsync = on
		synchronous_commit = on
	EOF
	start "$PRIMARY" "$PPORT"
	psql_at "$PPORT" "CREATE DATABASE test" >/dev/null
	psql_at "$PPORT" "SELECT pg_create_physical_replication_slot('$SLOT')" >/dev/null
	as "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PPORT" -U postgres -D "$REPLICA" -X stream -S "$SLOT" -R -c fast >/dev/null
	# The standby names itself (synchronous_standby_names refers to it) and
	# is never a synchronous primary of its own: after a promotion it has
	# no standby, and a setting copied from the primary would hang every
	# COMMIT.
	cat >>"$REPLICA/postgresql.auto.conf" <<-EOF
		primary_conninfo = 'host=127.0.0.1 port=$PPORT user=postgres application_name=$APP'
		primary_slot_name = '$SLOT'
		synchronous_standby_names = ''
	EOF
	start "$REPLICA" "$RPORT"
	for _ in $(seq 1 200); do
		streaming && return 0
		sleep 0.05
	done
	die "the standby on $RPORT does not stream from $PPORT (see $REPLICA.log)"
}

up() {
	local mode=${1:-async}
	case $mode in async | sync) ;; *) die "up: mode must be async or sync, not $mode" ;; esac
	streaming || build
	set_mode "$mode"
	echo "postgres: primary 127.0.0.1:$PPORT, standby 127.0.0.1:$RPORT ($mode)"
}

down() {
	stop_node "$REPLICA"
	stop_node "$PRIMARY"
	rm -rf "$WORK"
}

kill_primary() {
	local pid kids
	pid=$(pid_of "$PRIMARY") || die "kill-primary: the primary does not run"
	# The postmaster and every child at once, as when the machine dies: a
	# backend left alive after its postmaster could still answer a COMMIT.
	kids=$(ps -o pid= --ppid "$pid" | tr '\n' ' ')
	# shellcheck disable=SC2086
	kill -9 "$pid" $kids 2>/dev/null || true
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || { echo "postgres: primary (pid $pid) killed"; return 0; }
		sleep 0.05
	done
	die "kill-primary: pid $pid survived SIGKILL"
}

pause_wal() {
	local pid
	pid=$(psql_at "$PPORT" "SELECT pid FROM pg_stat_replication WHERE application_name = '$APP'")
	[ -n "$pid" ] || die "pause-wal: no walsender for $APP"
	kill -STOP "$pid"
	echo "postgres: walsender (pid $pid) stopped"
}

cold_standby() {
	[ "$(role_at "$RPORT")" = standby ] || die "cold-standby: no hot standby on $RPORT"
	psql_at "$RPORT" "ALTER SYSTEM SET hot_standby = off" >/dev/null
	as "$BIN/pg_ctl" -D "$REPLICA" -l "$REPLICA.log" -m fast -w -t 60 -o "-p $RPORT" restart >/dev/null
	echo "postgres: standby on 127.0.0.1:$RPORT restarted without hot standby"
}

promote() {
	[ "$(role_at "$RPORT")" = primary ] && { echo "postgres: 127.0.0.1:$RPORT is already primary"; return 0; }
	as "$BIN/pg_ctl" -D "$REPLICA" -w -t 60 promote >/dev/null
	echo "postgres: 127.0.0.1:$RPORT promoted"
}

status() {
	echo "primary 127.0.0.1:$PPORT: $(role_at "$PPORT")"
	echo "replica 127.0.0.1:$RPORT: $(role_at "$RPORT")"
	if [ "$(role_at "$PPORT")" = primary ]; then
		echo "synchronous_standby_names: '$(psql_at "$PPORT" "SHOW synchronous_standby_names")'"
		psql_at "$PPORT" "SELECT 'replication: ' || application_name || ' ' || state || ' ' || sync_state FROM pg_stat_replication"
	fi
}

case ${1:-} in
up) up "${2:-async}" ;;
down) down ;;
kill-primary) kill_primary ;;
pause-wal) pause_wal ;;
cold-standby) cold_standby ;;
promote) promote ;;
status) status ;;
*) die "usage: postgres.sh up [async|sync]|down|kill-primary|pause-wal|cold-standby|promote|status" ;;
esac
