// Package e2e holds the end-to-end tests and benchmarks of the outbox
// pipeline: consumer A (idem, idemrabbitmq) applies an effect and enqueues
// a follow-up event in the same transaction, the relay publishes it
// (amqppub, kafkapub), consumer B (idem) applies it. The relay and the
// consumers run as processes of their own, killed with SIGKILL and started
// again while messages flow. It has no API.
package e2e
