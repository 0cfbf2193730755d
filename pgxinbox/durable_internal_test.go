package pgxinbox

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// Only transactions the store began are held, and only until they end: a
// barrier in a transaction a ProcessTx caller owns leaves nothing behind.
func TestCommitNeedsHoldOnlyTheStoresTransactions(t *testing.T) {
	var c commitNeeds
	ours, theirs := pgx.Tx(&pendingTx{}), pgx.Tx(&pendingTx{})
	c.begun(ours)
	c.mark(ours)
	c.mark(theirs)
	if !c.has(ours) || c.has(theirs) {
		t.Fatalf("has(ours) = %v, has(theirs) = %v; want true, false", c.has(ours), c.has(theirs))
	}
	c.end(ours)
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	if n != 0 || c.has(ours) {
		t.Fatalf("%d transactions held after the store's ended", n)
	}
}
