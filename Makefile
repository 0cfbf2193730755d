GO ?= go
PKGS ?= ./...
# staticcheck at a pinned version, fetched and built by go run on first use.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test services bench lint demo

# Runs every test with the race detector, after bringing up PostgreSQL and
# RabbitMQ on 127.0.0.1 if they are down.
test: services lint
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	cd idemotel && $(GO) test -race -count=1 -timeout 15m ./...

services:
	@bash scripts/services.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd idemotel && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd idemotel && $(GO) run $(STATICCHECK) ./...

# Benchmarks: claim vs no claim, batch sizes; see README for the figures.
bench: services
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 1 ./pgxinbox/ ./sqlinbox/

demo:
	$(GO) run ./cmd/idem demo
