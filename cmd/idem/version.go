package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
)

func init() {
	register(command{name: "version", summary: "the module version and source revision of this build (--json)", run: runVersion})
}

// buildVersion is what `idem version` reports, read from the build
// information the Go toolchain embeds in the binary.
type buildVersion struct {
	Module    string `json:"module"`
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"revision_time,omitempty"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go"`
}

// readBuildVersion reads the build information; ok is false in a binary
// built without it.
func readBuildVersion() (buildVersion, bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{}, false
	}
	v := buildVersion{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	return v, true
}

func runVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newCmdFlags("version", "[--json]", "Prints the module version and the source revision (from the build information the Go\ntoolchain records; a build from a modified checkout says so).", stdout)
	jsonOut := f.Bool("json", false, "print JSON")
	if err := f.parse(args, false); err != nil {
		return err
	}
	v, ok := readBuildVersion()
	if !ok {
		return fmt.Errorf("this binary carries no build information (built without module support)")
	}
	if *jsonOut {
		return printJSON(stdout, v)
	}
	line := fmt.Sprintf("idem %s (%s)", v.Version, v.Module)
	if v.Revision != "" {
		line += " revision " + v.Revision
		if v.Time != "" {
			line += " " + v.Time
		}
		if v.Modified {
			line += " (modified)"
		}
	}
	_, err := fmt.Fprintf(stdout, "%s, %s\n", line, v.GoVersion)
	return err
}
