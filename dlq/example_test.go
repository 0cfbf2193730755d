package dlq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
)

// What an operator does after a fix is deployed: list the dead letters,
// look at one, redrive a reason's letters (a dry run first), then replay
// one message whose wrong effect was compensated by hand. Every call
// returns structs, for a command line or a web page to show.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Table: "idem_inbox", Key: idem.ByMessageID})
	if err != nil {
		log.Fatal(err)
	}
	src, err := dlq.NewRabbitMQ(dlq.RabbitMQConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "billing.invoice.dlq"})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()

	ls, err := dlq.List(ctx, src, 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range ls.Groups {
		fmt.Printf("%d × %s (%s)\n", g.Count, g.Reason, g.Consumer)
	}
	sh, err := dlq.Show(ctx, src, in, ls.Groups[0].IDs[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sh.Judgement.Verdict, sh.Judgement.Why)

	sel := dlq.Selection{Filter: dlq.Filter{Reason: "no tax rate"}, Rate: 50}
	dry, err := dlq.Redrive(ctx, src, in, sel) // changes nothing
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dry.Matched, "would be redriven:", dry.ByVerdict())
	sel.Apply = true
	res, err := dlq.Redrive(ctx, src, in, sel)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Done, "redriven,", res.Refused, "refused")

	// Apply once more a message whose key has a marker: the marker goes to
	// idem_inbox_retired with who and why, then the letter is redriven.
	_, err = dlq.Replay(ctx, src, in, dlq.Selection{Filter: dlq.Filter{IDs: []string{"01a23160-313d-70b8-935d-1c1630f21ddc"}}, Apply: true},
		dlq.Retirement{By: "alice", Why: "INC-1042: invoice voided by hand, issue it again"})
	if err != nil {
		log.Fatal(err)
	}
}
