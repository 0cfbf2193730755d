package idemprom

import (
	"errors"

	"github.com/idemkit/idem"
)

// Reasons are the values of the reason label of idem_dead_letters_total:
// why a message was dead-lettered, as a small fixed set. The full error
// text goes with the dead letter itself (the x-idem-reason header); a
// label must not carry it, or every distinct error would make a series.
const (
	ReasonNoMessageID      = "no_message_id"     // idem.ErrNoMessageID: the message carried no ID
	ReasonBadKey           = "bad_key"           // idem.ErrBadKey: the key func failed or gave an invalid key
	ReasonBadTime          = "bad_time"          // idem.ErrBadTime: its event-time header could not be read
	ReasonUntimed          = "untimed"           // idem.ErrUntimed: refused for having no event time (Config.RefuseUntimed)
	ReasonNoPartitionTime  = "no_partition_time" // idem.ErrNoPartitionTime: the partitioned inbox could not place the key
	ReasonExpired          = "expired"           // idem.ErrExpired: older than the retention window
	ReasonPruned           = "pruned"            // idem.ErrMarkerPruned: its marker was pruned (Config.RefuseLate)
	ReasonRetriesExhausted = "retries_exhausted" // idem.ErrRetriesExhausted: a transient error outlived the budget
	ReasonPermanent        = "permanent"         // idem.Permanent, or a database error that fails the same way every time
	ReasonOther            = "other"             // a result not dead-lettered by the processor's policy
)

// Reason is the reason label of a dead-lettered result: one of the Reason
// constants, decided from the sentinel errors the core wraps (never from
// error text). Expired results give expired, or pruned when the message met
// a marker a prune had deleted; DeadLettered results give the bad-input
// reason, retries_exhausted, or permanent (the processor dead-letters
// nothing else).
func Reason(r idem.Result) string {
	err := r.Err
	switch r.Outcome {
	case idem.Expired:
		if errors.Is(err, idem.ErrMarkerPruned) {
			return ReasonPruned
		}
		return ReasonExpired
	case idem.DeadLettered:
	default:
		return ReasonOther
	}
	switch {
	case errors.Is(err, idem.ErrNoMessageID):
		return ReasonNoMessageID
	case errors.Is(err, idem.ErrBadKey):
		return ReasonBadKey
	case errors.Is(err, idem.ErrBadTime):
		return ReasonBadTime
	case errors.Is(err, idem.ErrUntimed):
		return ReasonUntimed
	case errors.Is(err, idem.ErrNoPartitionTime):
		return ReasonNoPartitionTime
	case errors.Is(err, idem.ErrRetriesExhausted):
		// Before Permanent: the budget's error wraps the last try's error.
		return ReasonRetriesExhausted
	}
	return ReasonPermanent
}
