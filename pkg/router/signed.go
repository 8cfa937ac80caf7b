package router

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
)

// FilesPath is envd's file transfer endpoint, the one path a signed URL
// may name.
const FilesPath = "/files"

// signed reports whether r is a signed file URL (E2B's files.downloadUrl
// and uploadUrl): /files with a signature, fetched by a browser or curl
// without the envd token, to be judged by signedToken.
func signed(r *http.Request) bool {
	return r.URL.Path == FilesPath && r.URL.Query().Has("signature") && r.Header.Get(HeaderAccessToken) == ""
}

// signedToken checks r's signature (a bad one, another sandbox's, another
// operation's or user's, or one past its expiry is refused, as E2B's
// messages say) and returns the sandbox's envd token,
// which the router then hands the agent in X-Access-Token (the agent
// holds only the token's hash, so it cannot check a signature; the router
// holds the key the token is made from). The SDK signs
// "<path>:<operation>:<username>:<envd token>[:<expiry>]" with SHA-256,
// as "v1_" and the base64 digest without padding: operation "read" for a
// GET, "write" for a POST; the expiry, when set, is Unix seconds.
func signedToken(r *http.Request, key access.Key, s access.Sandbox, now time.Time) (string, error) {
	q := r.URL.Query()
	op := map[string]string{http.MethodGet: "read", http.MethodHead: "read", http.MethodPost: "write", http.MethodPut: "write"}[r.Method]
	if op == "" {
		return "", errors.New("a signed URL is for GET (download) or POST (upload), not " + r.Method)
	}
	token := key.Token(access.Envd, s)
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	exp := q.Get("signature_expiration")
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if !access.Equal(want, q.Get("signature")) {
		return "", errors.New("invalid signature")
	}
	if exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || now.After(time.Unix(at, 0)) {
			return "", errors.New("signature is already expired")
		}
	}
	return token, nil
}
