// Command structure prints the figures the project tracks about its own
// shape: what the root package exports to application authors, how many hook
// interfaces and migrators there are, the README's length, and the most
// complex functions. Run from the repository root:
//
//	go run ./scripts/structure
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	names, ifaces := rootAPI(".")
	fmt.Printf("root package: %d exported names, %d interfaces\n", names, len(ifaces))
	fmt.Printf("  interfaces: %s\n", strings.Join(ifaces, ", "))

	var hooks, migrations []string
	type fn struct {
		name string
		c    int
	}
	var fns []fn
	_ = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules":
				return filepath.SkipDir
			case "migrations":
				migrations = append(migrations, path)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return nil
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.GenDecl:
				for _, s := range decl.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					if _, ok := ts.Type.(*ast.InterfaceType); ok && (strings.HasSuffix(ts.Name.Name, "Hook") || strings.HasSuffix(ts.Name.Name, "Hooks")) {
						hooks = append(hooks, filepath.Dir(path)+"."+ts.Name.Name)
					}
				}
			case *ast.FuncDecl:
				if decl.Body != nil {
					name := decl.Name.Name
					if decl.Recv != nil && len(decl.Recv.List) > 0 {
						name = recvName(decl.Recv.List[0].Type) + "." + name
					}
					fns = append(fns, fn{path + ":" + name, complexity(decl.Body)})
				}
			}
		}
		return nil
	})
	sort.Strings(hooks)
	fmt.Printf("hook interfaces: %d\n  %s\n", len(hooks), strings.Join(hooks, ", "))
	fmt.Printf("migration directories: %d (%s)\n", len(migrations), strings.Join(migrations, ", "))
	if b, err := os.ReadFile("README.md"); err == nil {
		fmt.Printf("README.md: %d lines\n", strings.Count(string(b), "\n"))
	}
	sort.Slice(fns, func(i, j int) bool { return fns[i].c > fns[j].c })
	fmt.Println("most complex functions (cyclomatic):")
	for _, f := range fns[:min(8, len(fns))] {
		fmt.Printf("  %3d %s\n", f.c, f.name)
	}
}

// rootAPI counts the root package's exported top-level names (each const,
// var, type and function once; methods not counted) and lists its
// interfaces, over the non-test files.
func rootAPI(dir string) (names int, ifaces []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names++
							if _, ok := s.Type.(*ast.InterfaceType); ok {
								ifaces = append(ifaces, s.Name.Name)
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names++
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(ifaces)
	return names, ifaces
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}

// complexity is McCabe's count: one plus each branch point.
func complexity(body *ast.BlockStmt) int {
	c := 1
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
