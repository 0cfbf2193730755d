package pgtest

import (
	"context"
	"testing"
)

func TestSchemaIsolates(t *testing.T) {
	ctx := context.Background()
	a, b := Pool(t), Pool(t)
	if _, err := a.Exec(ctx, "CREATE TABLE x (id int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'x' AND table_schema = current_schema()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("second schema sees the first one's table")
	}
}
