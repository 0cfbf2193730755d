package sqlinbox

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// MySQLError has the shape of the driver's error type, which this package
// does not link (mysqlinbox's tests classify the driver's own errors).
type MySQLError struct {
	Number  uint16
	Message string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

func TestLockWaitSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Millisecond: "1", 300 * time.Millisecond: "1", time.Second: "1",
		1200 * time.Millisecond: "2", 5 * time.Second: "5",
	} {
		if got := lockWaitSeconds(d); got != want {
			t.Errorf("lockWaitSeconds(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestMySQLClassify(t *testing.T) {
	wrap := func(n uint16) error { return fmt.Errorf("claiming: %w", &MySQLError{Number: n}) }
	for _, c := range []struct {
		err     error
		class   idem.ErrorClass
		unknown bool // as a COMMIT's error
	}{
		{wrap(1213), idem.ClassBusy, false},
		{wrap(1205), idem.ClassBusy, false},
		{wrap(1062), idem.ClassPermanent, false},
		{wrap(1146), idem.ClassConfig, false},
		{wrap(1045), idem.ClassConfig, false},
		{wrap(2006), idem.ClassUnavailable, true},
		{wrap(2013), idem.ClassUnavailable, true},
		{wrap(1040), idem.ClassUnavailable, false},
		{wrap(1317), idem.ClassTransient, false},
		{errors.Join(errors.New("x"), driver.ErrBadConn), idem.ClassUnavailable, true},
		{fmt.Errorf("committing: %w", errors.New("invalid connection")), idem.ClassUnavailable, true},
		{errors.New("a handler's own error"), idem.ClassTransient, false},
	} {
		if got := MySQL.classify(c.err); got != c.class {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.class)
		}
		if got := MySQL.commitUnknown(c.err); got != c.unknown {
			t.Errorf("commitUnknown(%v) = %v, want %v", c.err, got, c.unknown)
		}
	}
}
