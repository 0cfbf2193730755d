package idemkey

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Claim is one request's attempt to own an idempotency key.
type Claim struct {
	// Scope namespaces the key (the authenticated client, see Config.Scope);
	// "" is a scope like any other.
	Scope string
	// Key is the client's idempotency key.
	Key string
	// Fingerprint identifies the request (see [Fingerprint]); a later request
	// with the same key and another fingerprint is refused.
	Fingerprint []byte
	// Token is unique to this attempt. Complete, Extend and Release act
	// only while the token still holds the key.
	Token string
	// Lease is how long the claim holds the key without news of it: the
	// middleware extends it (Store.Extend) while the handler runs, so it
	// lapses only when the server holding the key stops or cannot reach the
	// store, and then another request may take the key over (the middleware
	// cancels its own handler first).
	Lease time.Duration
	// TTL is how long a stored response is replayed.
	TTL time.Duration
}

// Record is what a store holds for a key another request claimed.
type Record struct {
	// Fingerprint is the fingerprint of the request that claimed the key.
	Fingerprint []byte
	// Response is the stored response, or nil while that request is still
	// in progress. When Fingerprint differs from the claim's, the response
	// is never replayed, and a store may leave its Header and Body empty.
	Response *Response
}

// Response is a response stored for replay.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the headers kept for replay (Config.Headers).
	Header http.Header
	// Body is the response body, byte for byte (as the handler wrote it,
	// encoded as its Content-Encoding header says).
	Body []byte
}

// ErrLeaseLost is returned by Store.Complete and Store.Extend when the
// claim's lease expired and another request took the key over. It is also
// the cause (context.Cause) of a handler's context that [Middleware]
// canceled because its lease could not be extended: the store unreachable or
// too slow for nine tenths of Config.Lease, or a server stalled that long.
// Either way the response is not stored and its client gets 409; the
// handler may have run twice (see [Middleware]).
var ErrLeaseLost = errors.New("idempotency key lease lost")

// Store keeps idempotency keys and their responses for [Middleware]. It is
// small on purpose, so that a store on another database can follow
// [PGStore]. Implementations must be safe for concurrent use, and Claim must
// decide races with the database's uniqueness (an insert that, on conflict,
// updates the existing row only when it expired: PostgreSQL's INSERT … ON
// CONFLICT DO UPDATE … WHERE expires_at <= now()), never with a read before
// a write.
type Store interface {
	// Claim gives c.Key in c.Scope to c.Token when the key is free: never
	// claimed, released, or expired (a stored response past its TTL, an
	// in-progress claim past its lease). It returns a nil record when the
	// claim won, the key's record otherwise. Of concurrent claims of a free
	// key, exactly one wins.
	Claim(ctx context.Context, c Claim) (*Record, error)
	// Complete stores resp as the key's response, kept for c.TTL. It returns
	// an error wrapping [ErrLeaseLost] when c.Token no longer holds the key.
	Complete(ctx context.Context, c Claim, resp Response) error
	// Extend renews the lease of the key held by c.Token, in progress, to
	// c.Lease from now. It returns an error wrapping [ErrLeaseLost] when
	// c.Token no longer holds the key, or the key has its response.
	Extend(ctx context.Context, c Claim) error
	// Release frees the key held by c.Token, so the next request with it
	// runs afresh. It does nothing when the token no longer holds the key.
	Release(ctx context.Context, c Claim) error
}
