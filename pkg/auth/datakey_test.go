package auth

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDataKeyOnlyWithoutHeaders: the api_key of an event's data is a
// credential only for a request that carries no header credential (kn func
// invoke). An event with a bearer token came through a Broker: it is judged
// by its token alone, whatever key its data carries, and a token that fails
// is not retried as that key.
func TestDataKeyOnlyWithoutHeaders(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const (
		trigger = "system:serviceaccount:deer-flow:trigger-oidc"
		alice   = "alice-key-0123456789"
	)
	good := jwt("aud", now.Add(time.Hour))
	forged := jwt("aud", now.Add(2*time.Hour))
	stranger := jwt("aud", now.Add(3*time.Hour))
	a := New(Settings{Key: key, Keys: map[string]string{"alice": alice}, Audience: "aud", AllowedSubjects: []string{trigger}},
		&fakeReviewer{tokens: map[string]Review{
			good:     {Authenticated: true, Username: trigger, Audiences: []string{"aud"}},
			stranger: {Authenticated: true, Username: "system:serviceaccount:deer-flow:sandbox", Audiences: []string{"aud"}},
		}})
	a.now = func() time.Time { return now }
	type verdict struct {
		Code      int
		Principal string
	}
	tests := []struct {
		name  string
		creds Credentials
		want  verdict
	}{
		{name: "the data's key alone (kn func invoke)", creds: Credentials{DataKey: alice}, want: verdict{Principal: "alice"}},
		{name: "a wrong data key alone", creds: Credentials{DataKey: alice + "x"}, want: verdict{Code: 401}},
		{name: "a verified token beside another principal's data key", creds: Credentials{Token: good, DataKey: alice}, want: verdict{Principal: trigger}},
		{name: "a forged token beside a good data key", creds: Credentials{Token: forged, DataKey: alice}, want: verdict{Code: 401}},
		{name: "a token not allowed beside a good data key", creds: Credentials{Token: stranger, DataKey: alice}, want: verdict{Code: 403}},
		{name: "not a JWT beside a good data key", creds: Credentials{Token: "abc", DataKey: alice}, want: verdict{Code: 401}},
		{name: "the header key beside another data key", creds: Credentials{Key: key, DataKey: alice}, want: verdict{Principal: "default"}},
		{name: "a wrong header key beside a good data key", creds: Credentials{Key: "nope", DataKey: alice}, want: verdict{Code: 401}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := a.Check(context.Background(), tc.creds, "get")
			if diff := cmp.Diff(tc.want, verdict{d.Code, d.Principal.Name}); diff != "" {
				t.Errorf("Check (-want +got):\n%s\ndetail: %s", diff, d.Detail)
			}
		})
	}
}
