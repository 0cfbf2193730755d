package leakcheck

import (
	"strings"
	"testing"
)

// TestGoroutinesSeesANewOne pins that a goroutine started after a snapshot
// is found, with its stack, and that one that ended is not.
func TestGoroutinesSeesANewOne(t *testing.T) {
	before := goroutines()
	stop := make(chan struct{})
	started := make(chan struct{})
	go parked(started, stop)
	<-started
	var found string
	for id, stack := range goroutines() {
		if _, ok := before[id]; !ok && !benign(stack) {
			found = stack
		}
	}
	close(stop)
	if !strings.Contains(found, "leakcheck.parked") {
		t.Fatalf("the parked goroutine was not found; new stacks: %q", found)
	}
}

func parked(started chan<- struct{}, stop <-chan struct{}) {
	close(started)
	<-stop
}
