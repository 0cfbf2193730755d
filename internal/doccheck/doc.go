// Package doccheck compiles the Go snippets of README.md and docs/*.md, so
// that a snippet stops compiling in a failing test rather than in a
// reader's editor. It has no code of its own; see doccheck_test.go for the
// conventions a snippet follows.
package doccheck
