package idemkey

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem"
)

// MaxLen is the longest key, in bytes, that [Derive] and [ForMessage]
// return and that [Validate] accepts: 255, the limit of the strictest common
// payment gateways. A derived key that would be longer is replaced by its
// action and a SHA-256 digest, never truncated, because two truncated keys
// could collide and answer a new charge with an old one.
const MaxLen = 255

// MaxActionLen is the longest action name [Derive] accepts.
const MaxActionLen = 64

// ErrInvalidKey is wrapped by every error about a malformed key or action.
var ErrInvalidKey = errors.New("invalid idempotency key")

// Derive returns the idempotency key of one business action, such as the
// charge of a subscription renewal:
//
//	idemkey.Derive("renew", "sub-8421", "2026-03") // "renew:sub-8421:2026-03"
//
// Derive the key from what makes the action one action — the subscription
// and the period — never from a row the action created (an invoice ID): when
// the row itself is duplicated, a key from the row changes with it and the
// gateway charges twice.
//
// The rules, which keep keys stable across releases:
//
//   - action must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ and be at most
//     [MaxActionLen] bytes. It is a constant of the calling code, so an
//     invalid action is a programming error and Derive panics (as
//     regexp.MustCompile does); use [Check] for actions that come from data.
//   - Each part follows a ':'. Bytes outside [A-Za-z0-9._-] in a part,
//     including ':' and '%', are written as %XX (upper-case hex), so the key
//     is printable ASCII and no two lists of parts share a key: ("a:b","c")
//     gives "x:a%3Ab:c", ("a","b:c") gives "x:a:b%3Ac". An empty part is kept
//     as an empty field, distinct from no part; validate your event's fields
//     before deriving, since an empty subscription ID would merge renewals.
//   - A key longer than [MaxLen] becomes action + "~" + the hex SHA-256 of
//     the long key. '~' never appears in a key that was not hashed, so a
//     hashed key cannot meet a readable one.
func Derive(action string, parts ...string) string {
	key, err := Check(action, parts...)
	if err != nil {
		panic("idemkey: " + err.Error())
	}
	return key
}

// Check is [Derive] for an action that is not a constant: it returns an
// error wrapping [ErrInvalidKey] instead of panicking.
func Check(action string, parts ...string) (string, error) {
	if err := validAction(action); err != nil {
		return "", err
	}
	return derive(action, parts), nil
}

// messageAction prefixes the keys of [ForMessage]. It starts with '@', which
// no action of [Derive] may, so the two families of keys never meet.
const messageAction = "@msg"

// ForMessage returns the key of a downstream call that has no business key
// of its own: the step-th call (a name such as "charge" or "notify", or a
// number) that consumer makes while handling msg. It depends only on the
// consumer, the message ID and the step, so a redelivery of msg, to any
// instance, sends the same key and the API answers with its first result.
//
// Prefer [Derive] with a business key when one exists: two different
// messages asking for the same effect get two keys here. ForMessage panics
// when consumer, msg.ID or step is empty; a processor never hands a handler a
// message without an ID.
func ForMessage(consumer string, msg idem.Message, step string) string {
	if consumer == "" || msg.ID == "" || step == "" {
		panic(fmt.Sprintf("idemkey: ForMessage needs a consumer, a message ID and a step (got %q, %q, %q)", consumer, msg.ID, step))
	}
	return derive(messageAction, []string{consumer, msg.ID, step})
}

// Validate reports, wrapping [ErrInvalidKey], why key cannot be used as an
// idempotency key: it must be 1 to [MaxLen] bytes of visible ASCII (0x21 to
// 0x7E). Every key of [Derive] and [ForMessage] is valid, and so are UUIDs
// and the keys common HTTP clients send.
func Validate(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte %#02x at %d is not visible ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

func validAction(action string) error {
	switch {
	case action == "":
		return fmt.Errorf("%w: empty action", ErrInvalidKey)
	case len(action) > MaxActionLen:
		return fmt.Errorf("%w: action of %d bytes, longer than %d", ErrInvalidKey, len(action), MaxActionLen)
	case !alnum(action[0]):
		return fmt.Errorf("%w: action %q must start with a letter or digit", ErrInvalidKey, action)
	}
	for i := 0; i < len(action); i++ {
		if !plain(action[i]) {
			return fmt.Errorf("%w: action %q: byte %#02x is not one of A-Z a-z 0-9 . _ -", ErrInvalidKey, action, action[i])
		}
	}
	return nil
}

func derive(action string, parts []string) string {
	var b strings.Builder
	b.WriteString(action)
	for _, p := range parts {
		b.WriteByte(':')
		escape(&b, p)
	}
	if b.Len() <= MaxLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return action + "~" + hex.EncodeToString(sum[:])
}

const upperHex = "0123456789ABCDEF"

func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
	}
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// plain bytes stand for themselves in a key; every other byte is escaped.
func plain(c byte) bool { return alnum(c) || c == '.' || c == '_' || c == '-' }
