GO ?= go
PKGS ?= ./...
# staticcheck at a pinned version, fetched and built by go run on first use.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test services bench bench-peers bench-growth lint demo cluster-faults

# Runs every test with the race detector, after bringing up PostgreSQL,
# RabbitMQ, MariaDB and Redis on 127.0.0.1 if they are down. Every module (the
# root, idemotel, bench/peers) runs even when one fails; the target fails
# if any did, and ends with one line per module.
test: services lint
	@GO='$(GO)' PKGS='$(PKGS)' bash scripts/test.sh

services:
	@bash scripts/services.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd idemotel && $(GO) vet ./...
	cd bench/peers && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd idemotel && $(GO) run $(STATICCHECK) ./...
	cd bench/peers && $(GO) run $(STATICCHECK) ./...

# Benchmarks: claim vs no claim, batch sizes; see docs/performance.md for the figures.
bench: services
	$(GO) test -run '^$$' -bench 'Claim|VersusHandRolled' -benchtime 3s -count 1 ./pgxinbox/ ./sqlinbox/ ./mysqlinbox/

# idem side by side with the peers (no guard, the inbox SQL by hand, a
# hand-rolled batched inbox, Watermill) on RabbitMQ, Kafka (kfake unless
# IDEM_KAFKA_BROKERS is set), NATS JetStream (an embedded nats-server unless
# IDEM_NATS_URL is set) and Redis Streams, every run checked for
# exactly-once; writes the figures and the chart under docs/bench/. See
# docs/performance.md.
PEERS_MESSAGES ?= 50000
PEERS_REPEAT ?= 1
bench-peers: services
	cd bench/peers && $(GO) run . -messages $(PEERS_MESSAGES) -repeat $(PEERS_REPEAT) -out ../../docs/bench/peers.json
	cd bench/peers && $(GO) run ./chart -in ../../docs/bench/peers.json -out ../../docs/bench/peers.svg

# Claim throughput as the inbox grows: 0, 1M and 10M markers, plain (v4 and
# v7 message IDs) and partitioned, as ratios to the empty inbox in the same
# run; see docs/performance.md, "Flat as the inbox grows". About 15 minutes and a few GB
# of disk.
bench-growth: services
	IDEM_BENCH_GROWTH_ROWS=0,1000000,10000000 IDEM_BENCH_GROWTH_MESSAGES=100000 IDEM_BENCH_GROWTH_ROUNDS=20 \
	$(GO) test -run '^$$' -bench Growth -benchtime 1x -timeout 120m -v ./pgxinbox/

demo:
	$(GO) run ./cmd/idem demo

# Faults of real clusters (not part of make test, which runs their smoke
# cases): a 3-node RabbitMQ cluster, a PostgreSQL primary with a streaming
# replica (asynchronous and synchronous), a 3-broker Kafka (kfake). Brings
# the clusters up on 127.0.0.1 and tears them down; writes the figures to
# docs/bench/cluster.json and prints them. See docs/clusters.md.
cluster-faults: services
	IDEM_CLUSTER=1 IDEM_CLUSTER_REPORT=$(CURDIR)/docs/bench/cluster.json $(GO) test -race -count=1 -timeout 45m -v -run . ./internal/clusterfault/
