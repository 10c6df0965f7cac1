package edgeplane_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The READMEs and BENCHMARKS.md link into each other by file and anchor; a
// heading renamed or a table moved breaks such a link silently on GitHub,
// so every relative link of the repository's markdown must name a file that
// exists and, when it has one, an anchor a heading of that file makes.
func markdownDocs(t *testing.T) []string {
	t.Helper()
	var docs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// mdLink matches an inline link or image target: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// codeSpan matches inline code, whose brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

// mdProse returns the lines of a markdown file, those of fenced code blocks
// blanked (line i of the file is element i-1).
func mdProse(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			line = ""
		}
		if fenced {
			line = ""
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// githubAnchor is the id GitHub gives a heading: lower case, punctuation
// other than '-' and '_' dropped, spaces turned into '-'.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdAnchors returns the anchors the headings of a markdown file make,
// numbering repeated ones as GitHub does (x, x-1, x-2).
func mdAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range mdProse(t, path) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := githubAnchor(text)
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

func TestMarkdownLinksResolve(t *testing.T) {
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		a := mdAnchors(t, path)
		anchorsOf[path] = a
		return a
	}
	docs := markdownDocs(t)
	for _, must := range []string{"README.md", "BENCHMARKS.md"} {
		if !slices.Contains(docs, must) {
			t.Errorf("%s is missing", must)
		}
	}
	checked := 0
	for _, doc := range docs {
		for i, line := range mdProse(t, doc) {
			line = codeSpan.ReplaceAllString(line, "")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := strings.Trim(m[1], "<>")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: a link to %s: no such file", doc, i+1, target)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s:%d: a link to %s: an anchor in a file that is not markdown", doc, i+1, target)
					continue
				}
				if !anchors(path)[anchor] {
					t.Errorf("%s:%d: a link to %s: %s has no heading with that anchor", doc, i+1, target, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatalf("no relative link found in %v: is the link pattern still right?", docs)
	}
	t.Logf("%d relative links checked in %v", checked, docs)
}
