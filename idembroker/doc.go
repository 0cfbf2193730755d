// Package idembroker is the kit every broker adapter of idem is written
// against: what a consumer reports about itself ([Health], [HealthState])
// and the probes that serve it ([HandleHealth]), and the redaction of
// connection URLs in logs and errors ([RedactURL]).
package idembroker
