package config

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseEntries: the one reader of "key=value;key=value" settings
// hands each entry over trimmed and in order, and refuses, naming the
// setting and the key or entry, what the principal settings refuse alike:
// an entry without a key or a value, a key its setting does not accept, a
// key listed twice, and a value its setting cannot read (which stops the
// reading there).
func TestParseEntries(t *testing.T) {
	validKey := func(k string) error {
		if k == "bad" {
			return errors.New(`"bad" is not a principal`)
		}
		return nil
	}
	type result struct {
		Read []string // key → value, in the order each was called
		Err  string
	}
	tests := []struct {
		name, raw string
		want      result
	}{
		{name: "unset", raw: "", want: result{}},
		{name: "blank entries", raw: " ; ;", want: result{}},
		{name: "trimmed, in order", raw: " b = x, y ;a=z ;", want: result{Read: []string{"b→x, y", "a→z"}}},
		{name: "a value keeps its '='", raw: "a=pods:app=x", want: result{Read: []string{"a→pods:app=x"}}},
		{name: "no '='", raw: "a", want: result{Err: `SETTING: entry "a" must be principal=thing`}},
		{name: "no value", raw: "a= ", want: result{Err: `SETTING: entry "a=" must be principal=thing`}},
		{name: "no key", raw: " =x", want: result{Err: `SETTING: entry "=x" must be principal=thing`}},
		{name: "a key refused", raw: "a=x;bad=y", want: result{Read: []string{"a→x"}, Err: `SETTING: "bad" is not a principal`}},
		{name: "a key refused before its duplicate", raw: "bad=x;bad=y", want: result{Err: `SETTING: "bad" is not a principal`}},
		{name: "a key twice", raw: "a=x; a =y", want: result{Read: []string{"a→x"}, Err: `SETTING: principal "a" is listed twice`}},
		{name: "a value refused stops the reading", raw: "a=fail;b=x", want: result{Read: []string{"a→fail"}, Err: `SETTING: principal "a": cannot read "fail"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got result
			err := parseEntries("SETTING", tc.raw, ";", "principal=thing", validKey, func(k, v string) error {
				got.Read = append(got.Read, k+"→"+v)
				if v == "fail" {
					return errors.New(`cannot read "fail"`)
				}
				return nil
			})
			if err != nil {
				got.Err = err.Error()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseEntries(%q) (-want +got):\n%s", tc.raw, diff)
			}
		})
	}
}
