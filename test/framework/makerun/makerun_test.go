package makerun

import "testing"

func TestPrinted(t *testing.T) {
	out := `  Provisioner on http://127.0.0.1:8080    API key: k1

  export E2B_API_URL=http://127.0.0.1:8080/e2b
  export E2B_SANDBOX_URL=http://10.96.0.20
  E2B_API_KEY=k1
  MY_E2B_API_URL=http://elsewhere
  curl -s -X POST http://127.0.0.1:8080/e2b/sandboxes -d 'E2B_API_URL=in-a-command'
`
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"E2B_API_URL", "http://127.0.0.1:8080/e2b", true},
		{"E2B_SANDBOX_URL", "http://10.96.0.20", true},
		{"E2B_API_KEY", "k1", true},
		{"FUNCTION_URL", "", false},
		{"API_URL", "", false},
	} {
		if got, ok := printed(out, tc.name); got != tc.want || ok != tc.ok {
			t.Errorf("printed(%s) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if got, _ := printed("E2B_API_KEY=old\nexport E2B_API_KEY=new\n", "E2B_API_KEY"); got != "new" {
		t.Errorf("printed took %q, want the last line's value", got)
	}
}
