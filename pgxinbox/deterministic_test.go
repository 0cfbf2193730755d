package pgxinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// A value too large for a btree index entry (SQLSTATE 54000, program limit
// exceeded) fails the same way on every try: the message is dead-lettered
// on its first attempt instead of running its handler five times.
func TestProgramLimitIsPermanent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE docs (body text); CREATE INDEX ON docs (body)`); err != nil {
		t.Fatal(err)
	}
	runs := 0
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "docs", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			runs++
			_, err := tx.Exec(ctx, `INSERT INTO docs VALUES ($1)`, string(m.Body))
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Random bytes do not compress: the index entry stays over the limit.
	raw := make([]byte, 15000)
	_, _ = rand.Read(raw)
	body := []byte(base64.StdEncoding.EncodeToString(raw))
	res := p.Process(ctx, idem.Message{ID: "big-1", Body: body, Time: time.Now()})
	if res.Outcome != idem.DeadLettered || runs != 1 || res.Attempts != 1 {
		t.Fatalf("outcome %v after %d runs (attempts %d, err %v); want a dead letter on the first", res.Outcome, runs, res.Attempts, res.Err)
	}
}
