package console

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

// Pauses pauses and resumes the consumers of the inbox table, keeping who
// and why in its audit table (idem_consumer_pause_log): *pgxinbox.Store
// has it.
type Pauses interface {
	Pause(ctx context.Context, consumer, by, why string) (idemstore.Pause, bool, error)
	Resume(ctx context.Context, consumer, by, why string) (idemstore.Pause, error)
	Pauses(ctx context.Context) ([]inboxdb.ConsumerPause, error)
}

// PausePage is the data of the consumers page: the paused consumers, the
// form that pauses or resumes one, and what was just done.
type PausePage struct {
	Paused []inboxdb.ConsumerPause
	Form   string
	Done   string
	Err    string
}

// pauseScope is the scope of the consumers page's form tokens.
const pauseScope = "consumers"

func (s *Server) consumersPage(w http.ResponseWriter, r *http.Request) {
	s.renderPauses(w, r, http.StatusOK, PausePage{})
}

func (s *Server) renderPauses(w http.ResponseWriter, r *http.Request, status int, p PausePage) {
	ps, err := s.cfg.Pauses.Pauses(r.Context())
	if err != nil {
		p.Err = strings.TrimPrefix(p.Err+"; ", "; ") + err.Error()
		if status == http.StatusOK {
			status = http.StatusBadGateway
		}
	}
	p.Paused = ps
	if s.Writable() {
		p.Form = s.formTokenFor(pauseScope, s.cfg.Now())
	}
	s.render(w, status, "consumers.html", "consumers", p)
}

// pauseAction pauses (op "pause") or resumes (op "resume") the consumer
// the form names: a POST with the console token, a fresh form token, who
// and why, kept in the audit table.
func (s *Server) pauseAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	if op != "pause" && op != "resume" {
		s.fail(w, http.StatusNotFound, "no such action: want pause or resume")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	switch {
	case s.cfg.ReadOnly:
		s.fail(w, http.StatusForbidden, "refused: the console is read-only (--read-only)")
		return
	case s.cfg.Token == "":
		s.fail(w, http.StatusForbidden, "refused: the console has no token, so it only reads (give idem console --token or IDEM_CONSOLE_TOKEN)")
		return
	case !s.tokenValid(r):
		s.fail(w, http.StatusForbidden, "refused: the console token is missing or wrong")
		return
	case !s.formValidFor(pauseScope, r.PostFormValue("form")):
		s.fail(w, http.StatusForbidden, "refused: the form is stale or not this console's (open the consumers page again)")
		return
	}
	consumer := strings.TrimSpace(r.PostFormValue("consumer"))
	by := strings.TrimSpace(r.PostFormValue("by"))
	why := strings.TrimSpace(r.PostFormValue("why"))
	if consumer == "" || by == "" || why == "" {
		s.fail(w, http.StatusBadRequest, "say which consumer, who and why: they are kept with the pause and in the audit table")
		return
	}
	var p PausePage
	status := http.StatusOK
	if op == "pause" {
		got, already, err := s.cfg.Pauses.Pause(r.Context(), consumer, by, why)
		switch {
		case err != nil:
			p.Err, status = err.Error(), http.StatusInternalServerError
		case already:
			p.Done = "consumer " + consumer + " was already paused by " + got.By + ": " + got.Why
		default:
			p.Done = "consumer " + consumer + " paused: every instance holds its messages within seconds, until it is resumed"
		}
	} else {
		got, err := s.cfg.Pauses.Resume(r.Context(), consumer, by, why)
		switch {
		case errors.Is(err, inboxdb.ErrNotPaused):
			p.Err, status = "consumer "+consumer+" is not paused", http.StatusConflict
		case err != nil:
			p.Err, status = err.Error(), http.StatusInternalServerError
		default:
			p.Done = "consumer " + consumer + " resumed (paused by " + got.By + ": " + got.Why + "): its instances apply the messages they held"
		}
	}
	s.cfg.Logger.Info("console: "+op, "consumer", consumer, "by", by, "why", why, "err", p.Err, "remote", r.RemoteAddr)
	s.renderPauses(w, r, status, p)
}
