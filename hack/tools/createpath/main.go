// Command createpath reads a `dlv trace` of the function while it serves one
// create and says which of the project's files and packages the request
// passed through, in call order: how many, how many moves from one to
// another, and how many of those moves came back to one it had left
// (hack/create-path.sh runs it; docs/architecture.md gives the figures).
//
// Usage: createpath REPO TRACE, with GOROUTINES (comma-separated ids: the
// request's goroutine and those it started; empty: all), UNIT=file|package,
// SKIP (a regexp of files left out: the transport wrappers every API call
// passes) and VERBOSE=1 (print the sequence).
package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const module = "github.com/deerflow-sandbox/provisioner/"

var (
	// call is a traced call: "> goroutine(N): pkg.(*T).Name(args".
	call = regexp.MustCompile(`^> goroutine\((\d+)\): ([^(\s]*(?:\(\*[^)]+\))?[^(\s\[]*)`)
	// closure suffixes belong to the function that holds them.
	closure = regexp.MustCompile(`(\.(func|deferwrap|gowrap)\d+(\.\d+)*)+$`)
	pointer = regexp.MustCompile(`\(\*([A-Za-z0-9_]+)\)`)
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: createpath REPO TRACE")
		os.Exit(2)
	}
	files, err := functionFiles(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "createpath:", err)
		os.Exit(1)
	}
	in, err := os.Open(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "createpath:", err)
		os.Exit(1)
	}
	defer in.Close()
	keep := map[string]bool{}
	for _, g := range strings.Split(os.Getenv("GOROUTINES"), ",") {
		if g != "" {
			keep[g] = true
		}
	}
	var skip *regexp.Regexp
	if s := os.Getenv("SKIP"); s != "" {
		skip = regexp.MustCompile(s)
	}
	var seq []string
	units := map[string]bool{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := call.FindStringSubmatch(sc.Text())
		if m == nil || len(keep) > 0 && !keep[m[1]] {
			continue
		}
		name := m[2]
		if i := strings.Index(name, "["); i >= 0 {
			name = name[:i] // a generic function's instance
		}
		name = closure.ReplaceAllString(strings.TrimSuffix(name, "-fm"), "")
		f, ok := files[name]
		if !ok {
			f, ok = files[pointer.ReplaceAllString(name, "$1")] // a value method called through a pointer
		}
		if !ok {
			fmt.Fprintln(os.Stderr, "createpath: no file for", name)
			continue
		}
		if skip != nil && skip.MatchString(f) {
			continue
		}
		if os.Getenv("UNIT") == "package" {
			f = filepath.Dir(f)
		}
		if len(seq) == 0 || seq[len(seq)-1] != f {
			seq = append(seq, f)
		}
		units[f] = true
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "createpath:", err)
		os.Exit(1)
	}
	seen, returns := map[string]bool{}, 0
	for _, f := range seq {
		if seen[f] {
			returns++
		}
		seen[f] = true
	}
	if os.Getenv("VERBOSE") != "" {
		fmt.Println(strings.Join(seq, " > "))
	}
	list := make([]string, 0, len(units))
	for u := range units {
		list = append(list, u)
	}
	sort.Strings(list)
	fmt.Printf("%d %ss, %d moves between them, %d of them back to one left before\n", len(units), unitName(), max(len(seq)-1, 0), returns)
	fmt.Println(strings.Join(list, " "))
}

func unitName() string {
	if os.Getenv("UNIT") == "package" {
		return "package"
	}
	return "file"
}

// functionFiles maps each function of fn/ and pkg/ (product code, no
// tests), by the name a trace gives it, to its file.
func functionFiles(root string) (map[string]string, error) {
	files := map[string]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || !strings.HasPrefix(rel, "pkg/") && !strings.HasPrefix(rel, "fn/") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse %s: %w", rel, err)
		}
		pkg := module + filepath.Dir(rel)
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				files[pkg+"."+receiver(fd)+fd.Name.Name] = rel
			}
		}
		return nil
	})
	return files, err
}

// receiver is "(*T)." or "T." for a method, "" for a function.
func receiver(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t, star := fd.Recv.List[0].Type, false
	if s, ok := t.(*ast.StarExpr); ok {
		t, star = s.X, true
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	id, ok := t.(*ast.Ident)
	if !ok {
		return ""
	}
	if star {
		return "(*" + id.Name + ")."
	}
	return id.Name + "."
}
