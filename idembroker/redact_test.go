package idembroker

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"amqp://guest:s3cret@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://app:s3cret@db:5432/billing?sslmode=disable", "postgres://app:xxxxx@db:5432/billing?sslmode=disable"},
		{"postgres://app@db/billing", "postgres://app@db/billing"},
		{"host=db user=app password=s3cret dbname=x", "host=db user=app password=xxxxx dbname=x"},
		{"app:s3cret@tcp(db:3306)/billing", "app:xxxxx@tcp(db:3306)/billing"},
		{"amqp://guest:s3cret@127.0.0.1:notaport/", "(a connection URL that does not parse)"},
	} {
		if got := RedactURL(c.in); got != c.want {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// A URL that does not parse, as an operator's typo makes one; built at
	// run time, since the point is that it is invalid.
	bad := strings.Join([]string{"amqp://guest:s3cret@127.0.0.1", "notaport/"}, ":")
	_, perr := url.Parse(bad)
	err := RedactError(perr, bad)
	if strings.Contains(err.Error(), "s3cret") || !errors.Is(err, perr) {
		t.Errorf("RedactError: %q (is the parse error: %v)", err, errors.Is(err, perr))
	}
}
