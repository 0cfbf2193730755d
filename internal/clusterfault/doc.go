// Package clusterfault is idem's suite of real-cluster faults: a 3-node
// RabbitMQ cluster with a quorum queue whose leader is killed, a PostgreSQL
// primary with a streaming replica that is promoted when the primary is
// killed (asynchronous and synchronous replication side by side), a
// 3-broker Kafka cluster (kfake) that loses partition leaders and the group
// coordinator while consuming, a 3-node JetStream cluster (nats-server
// nodes run as processes of the test binary) whose R3 stream leader is
// killed -9, and a Redis primary killed -9 with its asynchronous replica
// promoted.
//
// The whole suite runs with IDEM_CLUSTER=1 (make cluster-faults), which
// brings the clusters up with scripts/cluster/*.sh (the JetStream and
// Redis clusters are started by the tests themselves) and tears them
// down. A short smoke case of most runs in make test; the JetStream
// cluster's elections take seconds each, so it runs only in the suite. Each scenario records its
// figures (messages, kills, lost, doubled) with [Record]; with
// IDEM_CLUSTER_REPORT set, the figures are written there as JSON and
// printed as a table when the package's tests end.
package clusterfault
