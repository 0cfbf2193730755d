#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on 127.0.0.1 for the cluster fault suite
# (internal/clusterfault), apart from the machine's own broker: its nodes are
# idem1@localhost..idem3@localhost, AMQP on 5701..5703, distribution on
# 25701..25703, data, logs and pid files under one work directory, no
# plugins, and an Erlang cookie of their own. The broker on 5672 (and its
# epmd, which these nodes register with) is never touched.
#
#   rabbitmq.sh up             start the cluster (idempotent: starts the nodes
#                              that are down, or forms the cluster afresh)
#   rabbitmq.sh down           kill the nodes and remove the work directory
#   rabbitmq.sh kill NODE      kill -9 a node's beam process, as a crash would
#   rabbitmq.sh start NODE     start a killed node again (it rejoins)
#   rabbitmq.sh status         each node: running or not (exit 1 if any is down)
#   rabbitmq.sh pid NODE       the pid of a node's beam process
#   rabbitmq.sh leader QUEUE   the node that leads a quorum queue
#   rabbitmq.sh urls           the AMQP URLs of the nodes, one a line
#   rabbitmq.sh ctl NODE ARGS  rabbitmqctl ARGS against a node
#
# NODE is 1, 2, 3, idem2 or idem2@localhost.
#
# Environment: IDEM_RABBITMQ_CLUSTER_DIR (default /tmp/idem-cluster/rabbitmq),
# IDEM_RABBITMQ_CLUSTER_PORT (default 5700: the nodes listen on port+1..port+3
# and distribute on port+20001..port+20003).
#
# Fast on a small machine: the configuration is a plain Erlang term file
# (no rabbitmq.conf, whose schema translation costs seconds a node), the
# plugins directory holds only the broker's own applications, and the three
# nodes boot in parallel; the second and third then join the first one after
# the other (two concurrent joins can fail).
set -euo pipefail

DIR=${IDEM_RABBITMQ_CLUSTER_DIR:-/tmp/idem-cluster/rabbitmq}
BASE=${IDEM_RABBITMQ_CLUSTER_PORT:-5700}
NODES=(1 2 3)
COOKIE=IDEMCLUSTERFAULTSUITE
WAIT_SECONDS=120

die() {
	echo "rabbitmq.sh: $*" >&2
	exit 1
}

# bin finds the broker's own scripts. Debian's rabbitmq-server and rabbitmqctl
# in the PATH are wrappers that switch to the rabbitmq user and its home
# (and so its cookie and data); the scripts behind them take our environment.
bin() {
	for t in rabbitmq-server rabbitmqctl erl; do
		command -v "$t" >/dev/null || die "$t not found: install RabbitMQ (apt-get install rabbitmq-server)"
	done
	if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
		BIN=/usr/lib/rabbitmq/bin
	else
		BIN=$(dirname "$(command -v rabbitmq-server)")
	fi
}

name() { echo "idem$1@localhost"; }
port() { echo $((BASE + $1)); }

# node turns 2, idem2 or idem2@localhost into 2.
node() {
	local n=${1:-}
	n=${n%@localhost}
	n=${n#idem}
	case $n in 1 | 2 | 3) echo "$n" ;; *) die "no node ${1:-(none)}: use 1, 2, 3 or idem1@localhost..idem3@localhost" ;; esac
}

common_env() {
	export HOME=$DIR # the cookie is $HOME/.erlang.cookie, for the nodes and the CLI
	export RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf
	export RABBITMQ_CONFIG_FILE=$DIR/rabbitmq.config
	export RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/advanced.config
	export RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins
	export RABBITMQ_PLUGINS_DIR=$DIR/plugins
	export ERL_EPMD_ADDRESS=127.0.0.1
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}'
}

node_env() {
	local i=$1 d=$DIR/idem$1
	export RABBITMQ_NODENAME=$(name "$i")
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT=$(port "$i")
	export RABBITMQ_DIST_PORT=$((BASE + 20000 + i))
	export RABBITMQ_MNESIA_BASE=$d/mnesia
	export RABBITMQ_LOG_BASE=$d/log
	export RABBITMQ_PID_FILE=$d/pid
	export RABBITMQ_PLUGINS_EXPAND_DIR=$d/plugins-expand
}

ctl() {
	local i=$1
	shift
	common_env
	"$BIN/rabbitmqctl" -n "$(name "$i")" "$@"
}

pid_of() {
	local f=$DIR/idem$1/pid
	[ -s "$f" ] && cat "$f"
}

# running: the node's beam process exists and is not a zombie (a killed
# node whose parent has not reaped it yet holds no socket and no file).
running() {
	local pid state
	pid=$(pid_of "$1") && kill -0 "$pid" 2>/dev/null || return 1
	state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
	[ "${state#Z}" = "$state" ]
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$(port "$1")") 2>/dev/null; }

# prepare writes the work directory: cookie, configuration, an empty plugin
# list and a plugins directory of the broker's own applications (links to
# the installed ones, without the optional rabbitmq_* plugins).
prepare() {
	mkdir -p "$DIR"
	umask 077
	printf '%s' "$COOKIE" >"$DIR/.erlang.cookie"
	umask 022
	: >"$DIR/rabbitmq-env.conf"
	echo '[].' >"$DIR/rabbitmq.config"
	echo '[].' >"$DIR/enabled_plugins"
	local src
	src=$(ls -d "$BIN"/../lib/rabbitmq_server-*/plugins 2>/dev/null | head -n 1 || true)
	if [ -n "$src" ]; then
		mkdir -p "$DIR/plugins"
		for d in "$src"/*/; do
			d=${d%/}
			case $(basename "$d") in
			rabbitmq_prelaunch-*) ;;
			rabbitmq_*) continue ;;
			esac
			ln -sfn "$d" "$DIR/plugins/$(basename "$d")"
		done
	fi # else another layout: boot leaves the broker its default
	for i in "${NODES[@]}"; do mkdir -p "$DIR/idem$i"; done
}

# unregistered waits (up to 10s) until epmd no longer lists node i: a node
# started again right after a kill -9 could find its name still taken.
unregistered() {
	command -v epmd >/dev/null || return 0
	for _ in $(seq 1 100); do
		ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q "^name idem$1 at " || return 0
		sleep 0.1
	done
}

boot() {
	local i=$1
	unregistered "$i"
	(
		common_env
		[ -d "$DIR/plugins" ] || unset RABBITMQ_PLUGINS_DIR
		node_env "$i"
		rm -f "$RABBITMQ_PID_FILE" # a killed node's, or await takes it for dead
		"$BIN/rabbitmq-server" -detached >>"$DIR/idem$i/start.out" 2>&1
	)
}

# restart boots a node that is down and awaits it, booting it once more if
# it died at boot (once, so a node that cannot start still fails).
restart() {
	local i=$1
	if running "$i" && (await "$i"); then return; fi
	boot "$i"
	if ! (await "$i"); then
		echo "rabbitmq.sh: booting $(name "$i") once more" >&2
		boot "$i"
		await "$i"
	fi
}

# await waits for a node's AMQP port, which opens once the node booted (and,
# for a joining node, joined); it fails at once when the node died.
await() {
	local i=$1 deadline=$((SECONDS + WAIT_SECONDS))
	until listening "$i"; do
		if [ $SECONDS -ge $deadline ]; then
			tail -n 20 "$DIR/idem$i/log/$(name "$i").log" >&2 2>/dev/null || true
			die "$(name "$i") did not open port $(port "$i") within ${WAIT_SECONDS}s"
		fi
		# The node writes its pid file while booting: a file read half
		# written names no process, so a death counts once seen twice.
		if [ -s "$DIR/idem$i/pid" ] && ! running "$i" && sleep 0.5 && ! running "$i" && ! listening "$i"; then
			tail -n 20 "$DIR/idem$i/log/$(name "$i").log" >&2 2>/dev/null || true
			tail -n 20 "$DIR/idem$i/start.out" >&2 2>/dev/null || true
			die "$(name "$i") died while starting (log: $DIR/idem$i/log)"
		fi
		sleep 0.1
	done
}

# join makes node i a member of node 1's cluster. join_cluster logs
# harmless errors about tables of nodes not running yet: the output is
# shown only when a step fails.
join() {
	local i=$1 out
	for step in stop_app "join_cluster $(name 1)" start_app; do
		# shellcheck disable=SC2086 # step is a command and its argument
		out=$(ctl "$i" -q $step 2>&1) || die "rabbitmqctl -n $(name "$i") $step failed: $out"
	done
}

cmd_up() {
	bin
	if [ -f "$DIR/formed" ]; then
		for i in "${NODES[@]}"; do restart "$i" & done
		local failed=0
		for _ in "${NODES[@]}"; do wait -n || failed=1; done
		[ $failed = 0 ] || die "a node did not come back"
		return
	fi
	cmd_down >/dev/null
	local start=$SECONDS
	prepare
	for i in "${NODES[@]}"; do boot "$i" & done
	wait
	await 1
	for i in 2 3; do
		await "$i"
		join "$i"
	done
	local nodes
	nodes=$(ctl 1 -q eval 'length(rabbit_nodes:all_running()).')
	[ "$nodes" = 3 ] || die "the cluster has $nodes running nodes, not 3"
	touch "$DIR/formed"
	echo "rabbitmq.sh: $(name 1), $(name 2), $(name 3) up on 127.0.0.1:$(port 1)-$(port 3) in $((SECONDS - start))s"
}

cmd_down() {
	local pid
	for i in "${NODES[@]}"; do
		if running "$i"; then
			pid=$(pid_of "$i")
			kill -9 "$pid" 2>/dev/null || true
			while running "$i"; do sleep 0.05; done
		fi
	done
	rm -rf "$DIR"
}

cmd_kill() {
	local i pid
	i=$(node "${1:-}")
	running "$i" || die "$(name "$i") is not running"
	pid=$(pid_of "$i")
	kill -9 "$pid"
	while running "$i"; do sleep 0.02; done
	echo "rabbitmq.sh: killed $(name "$i") (pid $pid)"
}

cmd_start() {
	local i
	bin
	i=$(node "${1:-}")
	[ -f "$DIR/formed" ] || die "no cluster in $DIR: run up first"
	restart "$i"
	echo "rabbitmq.sh: $(name "$i") up on 127.0.0.1:$(port "$i")"
}

cmd_status() {
	local down=0 state
	for i in "${NODES[@]}"; do
		if running "$i" && listening "$i"; then
			state="running pid $(pid_of "$i")"
		elif running "$i"; then
			state="starting pid $(pid_of "$i")"
			down=1
		else
			state=stopped
			down=1
		fi
		echo "$(name "$i") amqp://127.0.0.1:$(port "$i")/ $state"
	done
	return $down
}

cmd_leader() {
	local q=${1:-} out
	[ -n "$q" ] || die "leader needs a queue name"
	bin
	for i in "${NODES[@]}"; do
		running "$i" && listening "$i" || continue
		if out=$(ctl "$i" -q list_queues name leader --no-table-headers 2>/dev/null); then
			echo "$out" | awk -v q="$q" '$1 == q { print $2; found = 1 } END { exit !found }' && return
			die "no queue $q on the cluster"
		fi
	done
	die "no running node answered"
}

cmd_urls() {
	for i in "${NODES[@]}"; do echo "amqp://guest:guest@127.0.0.1:$(port "$i")/"; done
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
kill) cmd_kill "${2:-}" ;;
start) cmd_start "${2:-}" ;;
status) cmd_status ;;
leader) cmd_leader "${2:-}" ;;
pid)
	i=$(node "${2:-}")
	running "$i" || die "$(name "$i") is not running"
	pid_of "$i"
	;;
urls) cmd_urls ;;
ctl)
	bin
	i=$(node "${2:-}")
	shift 2
	ctl "$i" "$@"
	;;
*)
	sed -n '2,24p' "$0" >&2
	exit 2
	;;
esac
