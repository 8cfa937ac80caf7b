package bounded

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCounts: each key has its own bound; a release gives one back, once
// however often it is called; a key with nothing open takes no memory.
func TestCounts(t *testing.T) {
	var c Counts
	var got []bool
	take := func(key string) func() {
		release, ok := c.Take(key, 2)
		got = append(got, ok)
		return release
	}
	a1 := take("alice")
	take("alice")
	take("alice") // refused: two open
	b := take("bob")
	a1()
	a1() // a second call gives nothing more back
	take("alice")
	take("alice") // refused again
	b()
	if diff := cmp.Diff([]bool{true, true, false, true, true, false}, got); diff != "" {
		t.Errorf("takes (-want +got):\n%s", diff)
	}
	if _, ok := c.n["bob"]; ok {
		t.Error("a key with nothing open is still counted")
	}
}
