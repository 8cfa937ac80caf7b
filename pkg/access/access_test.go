package access

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTokens(t *testing.T) {
	k, err := ParseKey([]byte(strings.Repeat("k", 40) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ParseKey([]byte(strings.Repeat("o", 40)))
	s := Sandbox{Principal: "alice", ID: "sb1", CreatedAt: "2026-11-28T11:00:00Z"}
	tok := k.Token(Envd, s)
	if len(tok) != 64 {
		t.Fatalf("token %q: want 64 hex digits", tok)
	}
	cases := []struct {
		name string
		key  Key
		kind Kind
		s    Sandbox
		want bool
	}{
		{"same", k, Envd, s, true},
		{"other kind", k, Traffic, s, false},
		{"other key", other, Envd, s, false},
		{"other principal", k, Envd, Sandbox{"bob", s.ID, s.CreatedAt}, false},
		{"recreated", k, Envd, Sandbox{s.Principal, s.ID, "2026-11-28T11:00:01Z"}, false},
		{"fields shifted", k, Envd, Sandbox{"alice", "sb1" + "2026", "-11-28T11:00:00Z"}, false},
		{"no key", nil, Envd, s, false},
		{"no id", k, Envd, Sandbox{Principal: "alice", CreatedAt: s.CreatedAt}, false},
	}
	got := map[string]bool{}
	want := map[string]bool{}
	for _, c := range cases {
		got[c.name] = c.key.Check(c.kind, c.s, tok)
		want[c.name] = c.want
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Check (-want +got):\n%s", d)
	}
	if !MatchesHash(Hash(tok), tok) || MatchesHash(Hash(tok), tok[1:]) || MatchesHash("", "") {
		t.Error("MatchesHash accepts a wrong token or refuses the right one")
	}
	if !MatchesHash(strings.ToUpper(Hash(tok)), tok) {
		t.Error("MatchesHash refuses an upper-case hash")
	}
}

func TestParseKeyRefusesShortKeys(t *testing.T) {
	if _, err := ParseKey([]byte(" short \n")); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("ParseKey(short) = %v; want an error naming the minimum", err)
	}
}
