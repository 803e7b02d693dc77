package timeline

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/checker"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"go.uber.org/goleak"
	"golang.org/x/net/html"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const base = int64(5_000_000_000)

func at(ms float64) int64 { return base + int64(ms*1e6) }

type builder struct{ h history.History }

func newHistory(lengthMS float64) *builder {
	return &builder{h: history.History{Meta: history.Meta{
		Backend: "redis <b>bold</b> & co", URL: "redis://127.0.0.1:6379/0", Fault: "kill", Fenced: false,
		Hold: 100 * time.Millisecond, TTL: 100 * time.Millisecond, Workers: 3, Keys: 2,
		Start: base, End: at(lengthMS), Expected: "unsafe without fencing",
	}}}
}

// lease records a granted lease with a write and, if rel > 0, a release at rel.
func (b *builder) lease(p, l int, key string, tok uint64, attempt, end, rel float64) {
	b.h.Ops = append(b.h.Ops, history.Op{Process: p, Key: key, Kind: history.Acquire, Lease: l, Start: at(attempt - 1), Attempt: at(attempt), End: at(end), OK: true, Token: tok})
	b.h.Ops = append(b.h.Ops, history.Op{Process: p, Key: key, Kind: history.Renew, Lease: l, Start: at(end + 1), Attempt: at(end + 1), End: at(end + 2), OK: true, Token: tok})
	b.h.Ops = append(b.h.Ops, history.Op{Process: p, Key: key, Kind: history.Write, Lease: l, Start: at(end + 3), Attempt: at(end + 3), End: at(end + 4), OK: true, Token: tok})
	if rel > 0 {
		b.h.Ops = append(b.h.Ops, history.Op{Process: p, Key: key, Kind: history.Release, Lease: l, Start: at(rel), Attempt: at(rel), End: at(rel + 1), OK: true, Token: tok})
	}
}

func (b *builder) write(p, l int, key string, tok uint64, t float64, acc bool, max uint64) {
	b.h.Writes = append(b.h.Writes, history.StoreWrite{Process: p, Key: key, Lease: l, Token: tok, Time: at(t), Accepted: acc, Max: max})
}

// unsafeHistory has one violation of every kind, a fault, a note, and text that
// needs escaping.
func unsafeHistory() *history.History {
	b := newHistory(1000)
	b.lease(1, 1, "k1", 5, 0, 1, 50)
	b.write(1, 1, "k1", 5, 4, true, 0)
	b.lease(2, 1, "k1", 3, 60, 61, 90)  // P4: smaller token after 5
	b.write(2, 1, "k1", 3, 64, true, 5) // P3 (unfenced)
	b.lease(3, 1, "k2", 7, 0, 1, 0)     // never released ...
	b.lease(1, 2, "k2", 8, 10, 20, 30)  // ... P1
	b.write(1, 2, "k2", 8, 23, true, 7)
	b.write(3, 1, "k2", 7, 24, false, 8)
	b.h.Ops = append(b.h.Ops, history.Op{Process: 2, Key: `k"<&>`, Kind: history.Acquire, Start: at(300), Attempt: at(300), End: at(600),
		Err: "dlock: locked by another owner\ncontext deadline exceeded <script>"}) // a lost release
	b.h.Events = append(b.h.Events,
		history.Event{Time: at(700), Kind: history.Fault, Fault: "kill", Target: "redis <1>"},
		history.Event{Time: at(750), Kind: history.Heal, Fault: "kill", Target: "redis <1>"},
		history.Event{Time: at(800), Kind: history.Note, Detail: "a note with <tags> & ampersands"},
	)
	return &b.h
}

func render(t *testing.T, h *history.History, r *checker.Report, opts Options) string {
	t.Helper()
	var buf bytes.Buffer
	if err := Render(&buf, h, r, opts); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// wellFormed checks that every element the page opens is closed in order (void
// HTML elements and self-closed SVG elements aside), and returns the parsed tree.
func wellFormed(t *testing.T, page string) *html.Node {
	t.Helper()
	void := map[string]bool{"meta": true, "br": true, "hr": true, "img": true, "input": true, "link": true}
	z := html.NewTokenizer(strings.NewReader(page))
	var stack []string
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if z.Err() != io.EOF {
				t.Fatalf("tokenizer: %v", z.Err())
			}
			if len(stack) != 0 {
				t.Fatalf("unclosed elements at the end: %v", stack)
			}
			doc, err := html.Parse(strings.NewReader(page))
			if err != nil {
				t.Fatal(err)
			}
			return doc
		case html.StartTagToken:
			name, _ := z.TagName()
			if !void[string(name)] {
				stack = append(stack, string(name))
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			if len(stack) == 0 || stack[len(stack)-1] != string(name) {
				t.Fatalf("</%s> closes %v", name, stack)
			}
			stack = stack[:len(stack)-1]
		}
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, c string) bool {
	return slices.Contains(strings.Fields(attr(n, "class")), c)
}

// find returns the elements for which ok holds.
func find(n *html.Node, ok func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && ok(c) {
			out = append(out, c)
		}
	}
	return out
}

func text(n *html.Node) string {
	var b strings.Builder
	for c := range n.Descendants() {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	}
	return b.String()
}

func TestRenderUnsafe(t *testing.T) {
	h := unsafeHistory()
	r := checker.Check(h, checker.Options{})
	if r.P1.Count != 1 || r.P3.Count != 1 || r.P4.Count != 1 || r.LostReleases.Count != 1 {
		t.Fatalf("the history does not have one violation of each kind: %+v", r)
	}
	page := render(t, h, r, Options{})
	doc := wellFormed(t, page)

	// A lease bar per lease, each with its tooltip.
	bars := find(doc, func(n *html.Node) bool { return hasClass(n, "leasebar") })
	if len(bars) != 4 {
		t.Fatalf("%d lease bars, want 4", len(bars))
	}
	for _, b := range bars {
		if !strings.Contains(text(b), "token") || b.FirstChild == nil || b.FirstChild.Data != "title" {
			t.Fatalf("lease bar without tooltip: %q", text(b))
		}
	}
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "p3") })); n != 1 {
		t.Fatalf("%d red P3 write markers, want 1", n)
	}
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "rej") })); n != 1 {
		t.Fatalf("%d rejected write markers, want 1", n)
	}
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "band") })); n != 1 {
		t.Fatalf("%d fault bands, want 1", n)
	}
	// P1 names two leases, P4 two more: four red outlines, plus the anchors of
	// the P3 example and the lost release (dashed).
	outlines := find(doc, func(n *html.Node) bool { return hasClass(n, "outline") })
	if len(outlines) != 6 {
		t.Fatalf("%d red outlines, want 6", len(outlines))
	}
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "dashed") })); n != 1 {
		t.Fatalf("%d dashed outlines, want 1", n)
	}

	// Every violation example links to an element on the timeline.
	links := find(doc, func(n *html.Node) bool { return n.Data == "a" })
	if len(links) != 4 {
		t.Fatalf("%d links, want one per violation example (4)", len(links))
	}
	for _, a := range links {
		id := strings.TrimPrefix(attr(a, "href"), "#")
		targets := find(doc, func(n *html.Node) bool { return attr(n, "id") == id })
		if len(targets) != 1 {
			t.Fatalf("link %q has %d targets", id, len(targets))
		}
		if hasClass(targets[0], "leasebar") || !strings.Contains(text(targets[0]), "ey ") && !strings.Contains(text(targets[0]), "store") && !strings.Contains(text(targets[0]), "waited") {
			t.Fatalf("link %q points at %q", id, text(targets[0]))
		}
	}

	// The summary shows the safety counts in red.
	for _, name := range []string{"P1 lease safety", "P3 resource safety", "P4 token order"} {
		rows := find(doc, func(n *html.Node) bool {
			return n.Data == "tr" && n.FirstChild != nil && text(n.FirstChild) == name
		})
		if len(rows) != 1 || !hasClass(rows[0], "bad") {
			t.Fatalf("summary row %q: %d rows, class %q", name, len(rows), attr(rows[0], "class"))
		}
	}
	if !strings.Contains(page, "UNSAFE") {
		t.Fatal("no UNSAFE verdict")
	}

	// Text from the history is escaped.
	for _, raw := range []string{"<b>bold</b>", "<script>", "<tags>", `k"<&>`, "<1>"} {
		if strings.Contains(page, raw) {
			t.Fatalf("page contains unescaped %q", raw)
		}
	}
	if !strings.Contains(text(doc), "redis <b>bold</b> & co") || !strings.Contains(text(doc), "k\"<&>") {
		t.Fatal("escaped text does not read back")
	}
	if strings.Contains(page, "truncated") && strings.Contains(page, "windows of time") {
		t.Fatal("a small history is drawn in windows")
	}
}

func TestRenderSafe(t *testing.T) {
	b := newHistory(200)
	b.h.Meta.Fenced = true
	b.lease(1, 1, "k1", 1, 0, 1, 50)
	b.write(1, 1, "k1", 1, 4, true, 0)
	b.lease(2, 1, "k1", 2, 60, 61, 90)
	b.write(2, 1, "k1", 2, 64, true, 1)
	page := render(t, &b.h, nil, Options{Title: "clean run"})
	doc := wellFormed(t, page)
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "bad") || hasClass(n, "outline") || hasClass(n, "p3") })); n != 0 {
		t.Fatalf("%d red elements in a clean run", n)
	}
	if !strings.Contains(page, "SAFE: no P1") || !strings.Contains(page, "<title>clean run</title>") {
		t.Fatal("no SAFE verdict or title")
	}
	if n := len(find(doc, func(n *html.Node) bool { return hasClass(n, "leasebar") })); n != 2 {
		t.Fatalf("%d lease bars, want 2", n)
	}
}

func TestNoExternalResources(t *testing.T) {
	h := unsafeHistory()
	page := render(t, h, nil, Options{})
	if strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Fatal("the page names an external URL")
	}
	doc := wellFormed(t, page)
	for _, n := range find(doc, func(*html.Node) bool { return true }) {
		switch n.Data {
		case "script", "link", "img", "iframe", "object", "embed", "image", "use":
			t.Fatalf("the page has a <%s> element", n.Data)
		}
		for _, a := range n.Attr {
			if a.Key == "src" || a.Key == "xlink:href" || a.Key == "href" && !strings.HasPrefix(a.Val, "#") {
				t.Fatalf("<%s %s=%q> may load something", n.Data, a.Key, a.Val)
			}
		}
	}
	if strings.Contains(page, "@import") || strings.Contains(page, "url(") {
		t.Fatal("the style sheet loads something")
	}
}

// bigHistory is n short leases in a row on four keys, with one P4 inversion in
// the middle and a fault near the end.
func bigHistory(n int) *history.History {
	b := newHistory(float64(n) * 2)
	b.h.Meta.Hold = time.Millisecond
	for i := range n {
		s := float64(i) * 2
		tok := uint64(i + 1)
		if i == n/2 {
			tok = 3 // smaller than earlier grants on its key
		}
		key := fmt.Sprintf("k%d", i%4)
		b.h.Ops = append(b.h.Ops,
			history.Op{Process: 1 + i%5, Key: key, Kind: history.Acquire, Lease: i + 1, Start: at(s), Attempt: at(s), End: at(s + 0.1), OK: true, Token: tok},
			history.Op{Process: 1 + i%5, Key: key, Kind: history.Release, Lease: i + 1, Start: at(s + 1), Attempt: at(s + 1), End: at(s + 1.1), OK: true, Token: tok})
		b.write(1+i%5, i+1, key, tok, s+0.5, true, tok-1)
	}
	f := float64(n)*2 - 500
	b.h.Events = append(b.h.Events,
		history.Event{Time: at(f), Kind: history.Fault, Fault: "pause", Target: "redis"},
		history.Event{Time: at(f + 20), Kind: history.Heal, Fault: "pause", Target: "redis"})
	return &b.h
}

func TestRenderTruncated(t *testing.T) {
	h := bigHistory(20_000)
	r := checker.Check(h, checker.Options{})
	if r.P4.Count != 1 {
		t.Fatalf("P4 count %d, want 1", r.P4.Count)
	}
	page := render(t, h, r, Options{MaxLeases: 500})
	doc := wellFormed(t, page)
	note := find(doc, func(n *html.Node) bool { return hasClass(n, "truncated") })
	if len(note) != 1 || !strings.Contains(text(note[0]), "20000 leases, more than the 500") {
		t.Fatalf("no truncation note: %v", len(note))
	}
	bars := find(doc, func(n *html.Node) bool { return hasClass(n, "leasebar") })
	if len(bars) > 500 || len(bars) < 250 {
		t.Fatalf("%d lease bars drawn, want about 500", len(bars))
	}
	panels := find(doc, func(n *html.Node) bool { return n.Data == "h3" })
	var titles []string
	for _, p := range panels {
		titles = append(titles, text(p))
	}
	all := strings.Join(titles, "\n")
	for _, want := range []string{"the start", "P4 token order example 1", "fault pause", "heal pause"} {
		if !strings.Contains(all, want) {
			t.Fatalf("no window around %s:\n%s", want, all)
		}
	}
	// The violation is drawn and linked.
	links := find(doc, func(n *html.Node) bool { return n.Data == "a" })
	if len(links) != 1 {
		t.Fatalf("%d links, want 1", len(links))
	}
	id := strings.TrimPrefix(attr(links[0], "href"), "#")
	if len(find(doc, func(n *html.Node) bool { return attr(n, "id") == id })) != 1 {
		t.Fatalf("link target %q missing", id)
	}
	if len(find(doc, func(n *html.Node) bool { return hasClass(n, "outline") })) != 2 {
		t.Fatal("the P4 leases are not outlined")
	}
	// Element ids are unique.
	seen := map[string]bool{}
	for _, n := range find(doc, func(n *html.Node) bool { return attr(n, "id") != "" }) {
		if seen[attr(n, "id")] {
			t.Fatalf("duplicate id %q", attr(n, "id"))
		}
		seen[attr(n, "id")] = true
	}
}

func TestNaturalOrder(t *testing.T) {
	keys := []string{"k10", "k2", "a", "k1", "b3", "k02x"}
	slices.SortFunc(keys, naturalCompare)
	if want := []string{"a", "b3", "k02x", "k1", "k2", "k10"}; !slices.Equal(keys, want) {
		t.Fatalf("%v, want %v", keys, want)
	}
}

func TestTicks(t *testing.T) {
	ts := ticks(at(3.3), at(1000), base, 1000)
	if len(ts) < 5 || len(ts) > 15 {
		t.Fatalf("%d ticks", len(ts))
	}
	for _, v := range ts {
		if (v-base)%int64(10*time.Millisecond) != 0 || v < at(3.3) || v > at(1000) {
			t.Fatalf("tick at %d ns is not a round time in the window", v-base)
		}
	}
}

func BenchmarkRender100k(b *testing.B) {
	h := bigHistory(100_000)
	r := checker.Check(h, checker.Options{})
	for b.Loop() {
		if err := Render(io.Discard, h, r, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
