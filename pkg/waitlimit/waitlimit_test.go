package waitlimit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestShare: the share of one principal is half the slots, and at least
// one; the replica-wide cap still holds across principals; a slot given
// back (once, however often release is called) can be taken again.
func TestShare(t *testing.T) {
	tests := []struct {
		total int
		takes []string // principals, in order
		want  []bool   // admitted
	}{
		{total: 1, takes: []string{"a", "b"}, want: []bool{true, false}},
		{total: 2, takes: []string{"a", "a", "b", "c"}, want: []bool{true, false, true, false}},
		{total: 3, takes: []string{"a", "a", "b", "c", "d"}, want: []bool{true, false, true, true, false}},
		{total: 4, takes: []string{"a", "a", "a", "b", "b", "c"}, want: []bool{true, true, false, true, true, false}},
	}
	for _, tc := range tests {
		s := New(tc.total)
		var got []bool
		for _, p := range tc.takes {
			_, err := s.Take(p)
			got = append(got, err == nil)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%d slots, takes %v (-want +got):\n%s", tc.total, tc.takes, diff)
		}
	}
	s := New(2)
	release, err := s.Take("a")
	if err != nil {
		t.Fatal(err)
	}
	release()
	release()
	if _, err := s.Take("a"); err != nil || s.Holding("a") != 1 {
		t.Errorf("after a double release: %v, holding %d; want the slot taken again, once", err, s.Holding("a"))
	}
}
