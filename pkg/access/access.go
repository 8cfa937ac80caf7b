// Package access makes and checks the tokens that let a caller into an E2B
// sandbox (docs/e2b.md): the envd access token (X-Access-Token, for the
// agent on port 49983) and the traffic token (e2b-traffic-access-token, for
// the sandbox's other ports).
//
// A token is an HMAC of the sandbox's identity (its principal, id and
// creation time) under one key that the function and the router share (a
// Secret). So nothing per sandbox is stored or written: the function answers
// the token on create and on connect, the router recomputes it from the Pod's
// own labels and annotations, and the agent inside the sandbox, which must
// not hold the key, gets only the token's SHA-256 in its environment. The
// creation time makes a token die with its sandbox: the same id created
// again, by the same principal or another, has another token.
package access

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// Kind says which door a token opens.
type Kind string

const (
	// Envd opens the agent (port 49983).
	Envd Kind = "envd"
	// Traffic opens the sandbox's other ports.
	Traffic Kind = "traffic"
)

// MinKeyBytes is the shortest key LoadKey accepts: an HMAC key shorter than
// the hash's output weakens every token made with it.
const MinKeyBytes = 32

// Key is the shared secret tokens are made with.
type Key []byte

// ParseKey checks a key's length; surrounding whitespace (a trailing newline
// in a Secret's file) is not part of it.
func ParseKey(b []byte) (Key, error) {
	k := []byte(strings.TrimSpace(string(b)))
	if len(k) < MinKeyBytes {
		return nil, fmt.Errorf("the token key has %d bytes; it needs at least %d (e.g. head -c 48 /dev/urandom | base64)", len(k), MinKeyBytes)
	}
	return Key(k), nil
}

// LoadKey reads a key from a file (a mounted Secret).
func LoadKey(path string) (Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the token key: %w", err)
	}
	k, err := ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// Sandbox is what a token is bound to.
type Sandbox struct {
	Principal string
	ID        string
	// CreatedAt is the sandbox's created-at annotation, as written.
	CreatedAt string
}

// Token is the token of kind for the sandbox: 64 hex digits. Fields are
// length-prefixed, so no two identities share an input.
func (k Key) Token(kind Kind, s Sandbox) string {
	m := hmac.New(sha256.New, k)
	for _, f := range []string{string(kind), s.Principal, s.ID, s.CreatedAt} {
		fmt.Fprintf(m, "%d:%s;", len(f), f)
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Check says whether got is the token of kind for the sandbox, in constant
// time. An empty key or sandbox id never matches.
func (k Key) Check(kind Kind, s Sandbox, got string) bool {
	if len(k) == 0 || s.ID == "" {
		return false
	}
	return Equal(k.Token(kind, s), got)
}

// Hash is the SHA-256 of a token, in hex: what the agent is given.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// MatchesHash says whether token hashes to hash, in constant time.
func MatchesHash(hash, token string) bool {
	if hash == "" || token == "" {
		return false
	}
	return Equal(Hash(token), strings.ToLower(hash))
}

// Equal compares two strings in constant time (for equal lengths).
func Equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
