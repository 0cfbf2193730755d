package idembroker

import (
	"net/url"
	"regexp"
	"strings"
)

// dsnPassword is the password of a keyword/value connection string
// (PostgreSQL's host=… password=…).
var dsnPassword = regexp.MustCompile(`password=(?:'(?:[^'\\]|\\.)*'|\S+)`)

// mysqlDSNPassword is the password of a Go MySQL driver DSN
// (user:password@tcp(host:3306)/db).
var mysqlDSNPassword = regexp.MustCompile(`^([^:@/]*):[^@]*@`)

// RedactURL returns s, a connection URL (postgres://, amqp://, mysql DSN)
// or a keyword/value connection string, with its password replaced by
// "xxxxx", for logs and errors: idem never logs or returns a credential it
// was given. A URL that does not parse becomes a placeholder, since its
// password cannot be found.
func RedactURL(s string) string {
	if !strings.Contains(s, "://") {
		if strings.Contains(s, "password=") {
			return dsnPassword.ReplaceAllString(s, "password=xxxxx")
		}
		return mysqlDSNPassword.ReplaceAllString(s, "${1}:xxxxx@")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(a connection URL that does not parse)"
	}
	return u.Redacted()
}

// RedactError returns err with every URL of urls, and its password, hidden
// in its text (see RedactURL), for an error a driver built around a URL it
// was given (a URL that does not parse is quoted whole). errors.Is and
// errors.As still see err.
func RedactError(err error, urls ...string) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	redacted := text
	for _, u := range urls {
		if u == "" {
			continue
		}
		redacted = strings.ReplaceAll(redacted, u, RedactURL(u))
		if p := password(u); p != "" {
			redacted = strings.ReplaceAll(redacted, p, "xxxxx")
		}
	}
	if redacted == text {
		return err
	}
	return &redactedError{err: err, text: redacted}
}

// password is the password in u, a URL, if any.
func password(u string) string {
	if parsed, err := url.Parse(u); err == nil && parsed.User != nil {
		p, _ := parsed.User.Password()
		return p
	}
	// A URL that does not parse: the text between the scheme's user and
	// the host.
	if _, rest, ok := strings.Cut(u, "://"); ok {
		if userinfo, _, ok := strings.Cut(rest, "@"); ok {
			if _, p, ok := strings.Cut(userinfo, ":"); ok {
				return p
			}
		}
	}
	return ""
}

type redactedError struct {
	err  error
	text string
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }
