package dlock

import "testing"

// Observe never delivers a state older than one it took.
func TestObserverSkipsStale(t *testing.T) {
	o := &observer{}
	lead := func(owner string, tok Token, v string) Leader {
		return Leader{Owner: owner, Token: tok, Value: []byte(v)}
	}
	steps := []struct {
		ld   Leader
		take bool
	}{
		{Leader{}, true},
		{Leader{}, false}, // no change
		{lead("a", 5, "x"), true},
		{lead("a", 5, "x"), false},
		{lead("a", 5, "y"), true}, // a new value
		{lead("b", 3, ""), false}, // an older leader read late
		{Leader{}, true},
		{lead("a", 5, "y"), false}, // the ended leader read late
		{lead("c", 6, ""), true},
	}
	for i, s := range steps {
		o.pending = false
		o.take(s.ld)
		if o.pending != s.take {
			t.Fatalf("step %d (%+v): taken %v, want %v", i, s.ld, o.pending, s.take)
		}
	}
}
