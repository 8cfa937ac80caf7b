package config

import (
	"fmt"
	"strings"
)

// parseEntries reads a setting of the form "key=value<sep>key=value". The
// principal settings separate entries with ';' because a service account's
// username holds ':' and a value holds ',', '|' or '='; PROVISIONER_API_KEYS
// with ',', as it always has (a key holds none). Blank entries are
// skipped, and keys and values are trimmed. shape is how an entry looks,
// "principal=source[|source...]": its text before '=' names the key in
// the errors. Each entry needs a key and a value; validKey judges the key
// before it is checked for a duplicate, and each reads the value, in
// order. Every error names the setting, and the key or entry it is about.
func parseEntries(setting, raw, sep, shape string, validKey func(key string) error, each func(key, value string) error) error {
	noun, _, _ := strings.Cut(shape, "=")
	seen := map[string]bool{}
	for _, entry := range strings.Split(raw, sep) {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		key, value, ok := strings.Cut(entry, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" || value == "" {
			return fmt.Errorf("%s: entry %q must be %s", setting, entry, shape)
		}
		if err := validKey(key); err != nil {
			return fmt.Errorf("%s: %w", setting, err)
		}
		if seen[key] {
			return fmt.Errorf("%s: %s %q is listed twice", setting, noun, key)
		}
		seen[key] = true
		if err := each(key, value); err != nil {
			return fmt.Errorf("%s: %s %q: %w", setting, noun, key, err)
		}
	}
	return nil
}
