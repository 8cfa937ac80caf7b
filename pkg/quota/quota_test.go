package quota

import (
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestTally(t *testing.T) {
	old := metav1.NewTime(time.Now().Add(-time.Minute))
	young := metav1.NewTime(time.Now())
	svc := func(id, user string, created metav1.Time, ownerUID types.UID) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName(id), UID: types.UID("svc-" + id), CreationTimestamp: created,
			Labels:          map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: id, keys.LabelUser: user},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", UID: ownerUID}}}}
	}
	deleting := svc("d", "alice", old, "pod-d")
	deleting.DeletionTimestamp = &old
	notSandbox := svc("n", "alice", old, "pod-n")
	notSandbox.Name = "something-else"
	own := svc("own", "alice", young, "pod-own")
	// A cold Pod's Service owns its Pod (issue 49): it has no owner.
	owning := svc("owning", "alice", old, "")
	owning.OwnerReferences = nil
	all := []metav1.Object{svc("a1", "alice", old, "pod-a1"), svc("a2", "alice", young, "pod-a2"), svc("b1", "bob", old, "pod-b1"),
		svc("ended", "alice", old, "pod-ended"), deleting, notSandbox, own, owning}
	tests := []struct {
		name        string
		own         *corev1.Service
		prospective int
		gone        map[types.UID]bool
		want        counted
	}{
		{name: "after the create: own counts, but not as settled", own: own, want: counted{total: 6, mine: 5, settledTotal: 4, settledMine: 3}},
		{name: "the Service of an ended Pod does not count", own: own, gone: map[types.UID]bool{"pod-ended": true},
			want: counted{total: 5, mine: 4, settledTotal: 3, settledMine: 2}},
		{name: "the Service that owns an ended Pod does not count", own: own, gone: map[types.UID]bool{"svc-owning": true},
			want: counted{total: 5, mine: 4, settledTotal: 3, settledMine: 2}},
		{name: "a look for room counts the create to come", prospective: 1, want: counted{total: 7, mine: 6, ours: 1, settledTotal: 4, settledMine: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tally(all, tc.own, "alice", "nobody", tc.prospective, tc.gone)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(counted{})); diff != "" {
				t.Errorf("tally (-want +got):\n%s", diff)
			}
		})
	}
}
