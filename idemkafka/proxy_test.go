package idemkafka_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/pgxinbox"
)

// throughProxy returns a store over d's schema whose connections go through
// a proxy, with a connect timeout of one second.
func (d *db) throughProxy(t testing.TB) (*pgxinbox.Store, *netfault.Proxy) {
	t.Helper()
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	p := netfault.New(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The database answers again before the pool closes, so that closing
	// does not wait for connections the proxy left unanswered.
	t.Cleanup(p.Restore)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store, p
}
