// Package clusterfault is idem's suite of real-cluster faults: a 3-node
// RabbitMQ cluster with a quorum queue whose leader is killed, a PostgreSQL
// primary with a streaming replica that is promoted when the primary is
// killed (asynchronous and synchronous replication side by side), and a
// 3-broker Kafka cluster (kfake) that loses partition leaders and the group
// coordinator while consuming.
//
// The whole suite runs with IDEM_CLUSTER=1 (make cluster-faults), which
// brings the clusters up with scripts/cluster/*.sh and tears them down. A
// short smoke case of each runs in make test. Each scenario records its
// figures (messages, kills, lost, doubled) with [Record]; with
// IDEM_CLUSTER_REPORT set, the figures are written there as JSON and
// printed as a table when the package's tests end.
package clusterfault
