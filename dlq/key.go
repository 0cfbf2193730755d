package dlq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem"
)

// ParseKey returns the key function a spec names, for a program (the
// command line) that judges letters with the consumers' key and cannot
// be handed their Go function:
//
//	id                      the message ID (idem.ByMessageID)
//	json:/pointer           the string or number at a JSON pointer (RFC 6901)
//	                        into the body: json:/invoice/id
//	template:TEXT           TEXT with {id} replaced by the message ID and each
//	                        {/pointer} by the value there:
//	                        template:invoice:{/customer}:{/period}
//
// A body that does not decode, or a pointer to nothing or to an object,
// array, boolean or null, is no key: the letter is judged invalid, as the
// consumer, whose key function fails on it, dead-letters it.
func ParseKey(spec string) (idem.KeyFunc, error) {
	switch kind, arg, _ := strings.Cut(spec, ":"); {
	case spec == "id":
		return idem.ByMessageID, nil
	case kind == "json":
		if err := checkPointer(arg); err != nil {
			return nil, fmt.Errorf("key %q: %w", spec, err)
		}
		return func(m idem.Message) (string, error) {
			doc, err := decodeBody(m.Body)
			if err != nil {
				return "", err
			}
			return pointer(doc, arg)
		}, nil
	case kind == "template":
		parts, err := parseTemplate(arg)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", spec, err)
		}
		return func(m idem.Message) (string, error) {
			var b strings.Builder
			var doc any
			decoded := false
			for _, p := range parts {
				switch {
				case !p.field:
					b.WriteString(p.text)
				case p.text == "id":
					b.WriteString(m.ID)
				default:
					if !decoded {
						if doc, err = decodeBody(m.Body); err != nil {
							return "", err
						}
						decoded = true
					}
					v, err := pointer(doc, p.text)
					if err != nil {
						return "", err
					}
					b.WriteString(v)
				}
			}
			return b.String(), nil
		}, nil
	}
	return nil, fmt.Errorf("key %q: want id, json:/pointer or template:TEXT with {id} and {/pointer} in it", spec)
}

func decodeBody(body []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("decoding body for key: %w", err)
	}
	return v, nil
}

func checkPointer(p string) error {
	if !strings.HasPrefix(p, "/") {
		return errors.New("a JSON pointer starts with /")
	}
	return nil
}

// pointer is the string or number at JSON pointer p in doc.
func pointer(doc any, p string) (string, error) {
	v := doc
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return "", fmt.Errorf("the body has nothing at %s", p)
			}
		case []any:
			var i int
			if _, err := fmt.Sscanf(tok, "%d", &i); err != nil || i < 0 || i >= len(x) || fmt.Sprint(i) != tok {
				return "", fmt.Errorf("the body has nothing at %s", p)
			}
			v = x[i]
		default:
			return "", fmt.Errorf("the body has nothing at %s", p)
		}
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	}
	return "", fmt.Errorf("the body's value at %s is not a string or a number", p)
}

type templatePart struct {
	text  string
	field bool // {id} or {/pointer}
}

func parseTemplate(s string) ([]templatePart, error) {
	var out []templatePart
	fields := 0
	for s != "" {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			out = append(out, templatePart{text: s})
			break
		}
		if i > 0 {
			out = append(out, templatePart{text: s[:i]})
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, errors.New("a { without its }")
		}
		f := s[i+1 : i+j]
		if f != "id" {
			if err := checkPointer(f); err != nil {
				return nil, fmt.Errorf("{%s}: want {id} or {/pointer}", f)
			}
		}
		out = append(out, templatePart{text: f, field: true})
		fields++
		s = s[i+j+1:]
	}
	if fields == 0 {
		return nil, errors.New("a template names at least one {id} or {/pointer}: a constant key would make every message a duplicate")
	}
	return out, nil
}
