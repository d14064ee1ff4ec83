// Package doccheck checks the relative links of the repository's Markdown
// files: [text](path), [text](path#anchor) and [text](#anchor). A link's
// path must name a file or directory of the repository, relative to the
// Markdown file that holds it (or to the repository root when it starts
// with "/"), and its anchor must name a heading, or an <a id> or <a name>,
// of the target Markdown file, with GitHub's rules for heading anchors.
// Links with a scheme (https:, mailto:) and links inside fenced code blocks
// or inline code are not checked. The test in this package runs the check
// over every tracked *.md file.
package doccheck

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// Problem is one broken link.
type Problem struct {
	File   string // slash-separated, relative to the repository root
	Line   int
	Target string // the link as written
	Why    string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: broken link %s (%s)", p.File, p.Line, p.Target, p.Why)
}

// Repo is the set of files links may point to.
type Repo struct {
	Root string
	// Files are the repository's files, slash-separated and relative to
	// Root; a path is a directory when some file lies under it.
	Files map[string]bool
	dirs  map[string]bool
	// anchors caches the anchors of each Markdown file read so far.
	anchors map[string]map[string]bool
}

// skipDirs are never walked when git cannot list the files.
var skipDirs = map[string]bool{".git": true, "_output": true, "bin": true}

// Open lists the files of the repository at root: those git tracks or
// would track (untracked files that are not ignored), or, without git,
// every file under root outside .git, _output and bin.
func Open(root string) (*Repo, error) {
	files, err := gitFiles(root, "--cached", "--others", "--exclude-standard")
	if err != nil {
		files, err = walkFiles(root)
		if err != nil {
			return nil, err
		}
	}
	r := &Repo{Root: root, Files: map[string]bool{}, dirs: map[string]bool{".": true}, anchors: map[string]map[string]bool{}}
	for _, f := range files {
		r.Files[f] = true
		for d := path.Dir(f); d != "." && !r.dirs[d]; d = path.Dir(d) {
			r.dirs[d] = true
		}
	}
	return r, nil
}

// MarkdownFiles are the *.md files git tracks (every *.md file of the walk
// without git), sorted.
func MarkdownFiles(root string) ([]string, error) {
	files, err := gitFiles(root, "--cached")
	if err != nil {
		files, err = walkFiles(root)
		if err != nil {
			return nil, err
		}
	}
	var md []string
	for _, f := range files {
		if strings.HasSuffix(f, ".md") {
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(f))); err == nil {
				md = append(md, f)
			}
		}
	}
	sort.Strings(md)
	return md, nil
}

func gitFiles(root string, args ...string) ([]string, error) {
	cmd := exec.Command("git", append([]string{"ls-files", "-z"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var files []string
	for _, f := range bytes.Split(out, []byte{0}) {
		if len(f) > 0 {
			files = append(files, string(f))
		}
	}
	return files, nil
}

func walkFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && skipDirs[d.Name()] {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// Check returns the broken links of the Markdown file file (relative to
// the repository root).
func (r *Repo) Check(file string) ([]Problem, error) {
	data, err := os.ReadFile(filepath.Join(r.Root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	var problems []Problem
	for _, l := range Links(string(data)) {
		if why := r.broken(file, l.Target); why != "" {
			problems = append(problems, Problem{File: file, Line: l.Line, Target: l.Target, Why: why})
		}
	}
	return problems, nil
}

var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// broken says why target, a link in file, is broken, or "" when it is not.
func (r *Repo) broken(file, target string) string {
	if scheme.MatchString(target) {
		return ""
	}
	p, anchor, _ := strings.Cut(target, "#")
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	if up, err := url.PathUnescape(p); err == nil {
		p = up
	}
	if ua, err := url.PathUnescape(anchor); err == nil {
		anchor = ua
	}
	dest := file
	if p != "" {
		if strings.HasPrefix(p, "/") {
			dest = path.Clean(strings.TrimPrefix(p, "/"))
		} else {
			dest = path.Clean(path.Join(path.Dir(file), p))
		}
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "outside the repository"
		}
		if !r.Files[dest] && !r.dirs[dest] {
			return "no such file: " + dest
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") || r.dirs[dest] {
		return ""
	}
	anchors, err := r.Anchors(dest)
	if err != nil {
		return err.Error()
	}
	if anchors[anchor] || anchors[strings.ToLower(anchor)] {
		return ""
	}
	return fmt.Sprintf("no anchor #%s in %s", anchor, dest)
}

// Anchors are the anchors of the Markdown file file: its headings' GitHub
// anchors and its <a id> and <a name> values.
func (r *Repo) Anchors(file string) (map[string]bool, error) {
	if a, ok := r.anchors[file]; ok {
		return a, nil
	}
	data, err := os.ReadFile(filepath.Join(r.Root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	a := Anchors(string(data))
	r.anchors[file] = a
	return a, nil
}

// Link is a link found in Markdown text.
type Link struct {
	Line   int
	Target string
}

var (
	linkRE     = regexp.MustCompile(`\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	atxRE      = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextRE   = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`(?i)<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']`)
)

// Links are the inline links and images of md outside fenced code blocks and
// inline code, in order.
func Links(md string) []Link {
	var links []Link
	for _, l := range proseLines(md) {
		for _, m := range linkRE.FindAllStringSubmatch(stripInlineCode(l.text), -1) {
			t := strings.TrimSuffix(strings.TrimPrefix(m[1], "<"), ">")
			if t != "" {
				links = append(links, Link{Line: l.n, Target: t})
			}
		}
	}
	return links
}

// Anchors are the anchors GitHub gives md: one per heading (ATX or setext),
// a heading whose anchor was taken before getting -1, -2, …, and the values of
// <a id=…> and <a name=…>.
func Anchors(md string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	add := func(heading string) {
		s := Slug(heading)
		if n, ok := seen[s]; ok {
			seen[s] = n + 1
			s = fmt.Sprintf("%s-%d", s, n+1)
		} else {
			seen[s] = 0
		}
		anchors[s] = true
	}
	lines := proseLines(md)
	for i, l := range lines {
		for _, m := range htmlAnchor.FindAllStringSubmatch(stripInlineCode(l.text), -1) {
			anchors[m[1]] = true
		}
		if m := atxRE.FindStringSubmatch(l.text); m != nil {
			add(m[2])
			continue
		}
		// A setext underline turns the paragraph line just above it into a
		// heading ("---" under a table row or list item does not).
		if i > 0 && setextRE.MatchString(l.text) {
			prev := lines[i-1]
			t := strings.TrimSpace(prev.text)
			if prev.n == l.n-1 && t != "" && !strings.HasPrefix(t, "|") && !strings.HasPrefix(t, "- ") &&
				!strings.HasPrefix(t, "* ") && !strings.HasPrefix(t, ">") && atxRE.FindStringSubmatch(prev.text) == nil {
				add(t)
			}
		}
	}
	return anchors
}

var (
	headingLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag     = regexp.MustCompile(`<[^>]+>`)
)

// Slug is GitHub's anchor for a heading's text: the text as rendered (inline
// code, links and emphasis reduced to their text, HTML tags dropped),
// lowercased, every character that is not a letter, mark, number, connector
// punctuation ('_'), hyphen or space dropped, and each space turned into '-'.
func Slug(heading string) string {
	h := headingLink.ReplaceAllString(heading, "$1")
	h = htmlTag.ReplaceAllString(h, "")
	var b strings.Builder
	for _, c := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case c == ' ':
			b.WriteRune('-')
		case c == '-' || unicode.IsLetter(c) || unicode.IsNumber(c) || unicode.Is(unicode.Mn, c) ||
			unicode.Is(unicode.Mc, c) || unicode.Is(unicode.Me, c) || unicode.Is(unicode.Pc, c):
			b.WriteRune(c)
		}
	}
	return b.String()
}

type line struct {
	n    int
	text string
}

var fenceRE = regexp.MustCompile("^[ \t]*(`{3,}|~{3,})")

// proseLines are the lines of md outside fenced code blocks (the fences
// included), numbered from 1. A fence may be indented (inside a list item);
// it closes at a fence of the same character at least as long.
func proseLines(md string) []line {
	var out []line
	var open string
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for n := 1; sc.Scan(); n++ {
		t := sc.Text()
		if m := fenceRE.FindStringSubmatch(t); m != nil {
			switch {
			case open == "":
				open = m[1]
				continue
			case m[1][0] == open[0] && len(m[1]) >= len(open) && strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(t), m[1][:1])) == "":
				open = ""
				continue
			}
		}
		if open == "" {
			out = append(out, line{n: n, text: t})
		}
	}
	return out
}

// stripInlineCode blanks the code spans of a line: a run of backticks up to
// the next run of the same length.
func stripInlineCode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if s[i] != '`' {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] == '`' {
			j++
		}
		run := s[i:j]
		end := -1
		for k := j; k < len(s); {
			if s[k] != '`' {
				k++
				continue
			}
			l := k
			for l < len(s) && s[l] == '`' {
				l++
			}
			if l-k == len(run) {
				end = l
				break
			}
			k = l
		}
		if end < 0 {
			b.WriteString(run)
			i = j
			continue
		}
		b.WriteString(strings.Repeat(" ", end-i))
		i = end
	}
	return b.String()
}
