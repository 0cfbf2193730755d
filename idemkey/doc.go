// Package idemkey is idem's third layer of defense: idempotency keys for the
// calls a consumer makes outside its own database, where no inbox and no
// unique index reach. A redelivered message, or a duplicated invoice, must
// not charge a card twice; a payment gateway that honours an idempotency key
// answers a repeated charge with the first one.
//
// # Deriving keys
//
// Derive the key from the business action, never from a row the action
// created. In the billing incident the key "invoice-<invoice ID>" would have
// failed exactly when it was needed: the second invoice row has another ID.
// [Derive] builds a readable, unambiguous, bounded key:
//
//	key := idemkey.Derive("renew", e.SubscriptionID, e.Period) // "renew:sub-8421:2026-03"
//
// For a call with no business key, [ForMessage] keys it by the consumer, the
// message ID and the step, which a redelivery repeats exactly:
//
//	key := idemkey.ForMessage("invoices", msg, "charge")
//
// # Sending keys
//
// [Transport] puts the key of a request's context ([WithKey]) into the
// [Header] of that request and of every retry of it:
//
//	client := &http.Client{Transport: &idemkey.Transport{}}
//	req, err := http.NewRequestWithContext(idemkey.WithKey(ctx, key), "POST", gatewayURL, body)
//
// # Honouring keys
//
// A service of your own becomes such a gateway with [Middleware] over a
// [Store], here [PGStore] on PostgreSQL:
//
//	store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: "idempotency_keys"})
//	// store.Migrate(ctx) once; store.Prune(ctx, 0) hourly
//	mux.Handle("POST /charges", idemkey.Middleware(store, &idemkey.Config{
//		Scope: func(r *http.Request) string { return clientID(r) },
//	})(chargeHandler))
//
// The first request with a key claims it (an INSERT whose conflict with an
// existing key updates the row only to take over an expired one), runs the
// handler and stores its response; a repeat gets that response replayed
// with Idempotent-Replayed: true, a repeat while the first runs gets 409,
// the same key on another request gets 422, and a 503 frees the key for a
// retry (other 5xx are stored and replayed: the work may have been done).
// The key's lease is extended while the handler runs; when it cannot be,
// the handler's context is canceled with [ErrLeaseLost] before another
// request can take the key, and nothing it answers is stored. A retry may
// then run the handler again, so what it sent downstream before the
// cancellation must carry a key of its own:
//
//	scope, key, _ := idemkey.RequestKey(r.Context())
//	ctx := idemkey.WithKey(r.Context(), idemkey.Derive("charge", scope, key))
//
// See [Middleware] for the whole contract.
package idemkey
