package config

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ParseTolerations turns entries of the form key[=value]:Effect (as kubectl
// taint prints them) into tolerations. An entry without a value tolerates the
// key whatever its value.
func ParseTolerations(entries []string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for _, e := range entries {
		kv, effect, ok := strings.Cut(e, ":")
		if !ok {
			return nil, fmt.Errorf("toleration %q: want key[=value]:Effect", e)
		}
		switch corev1.TaintEffect(effect) {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("toleration %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", e)
		}
		t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
		key, value, hasValue := strings.Cut(kv, "=")
		t.Key = key
		if hasValue {
			t.Operator, t.Value = corev1.TolerationOpEqual, value
		}
		if t.Key == "" {
			return nil, fmt.Errorf("toleration %q: key is empty", e)
		}
		out = append(out, t)
	}
	return out, nil
}
