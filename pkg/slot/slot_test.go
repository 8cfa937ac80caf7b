package slot

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// The fake clientset stands in for the API server: these are the slot's
// rules alone; pkg/sandbox's TestASlotHasOneWriter holds them for the
// create and the destroy, and test/e2e's TestQuotaHoldsUnderFaults on a
// real API server under faults.

const ns = "deer-flow"

// aSlot is a slot of sandbox s1 made age ago, as its create writes it.
func aSlot(t *testing.T, age time.Duration) *corev1.Service {
	s := apitest.Spec()
	s.ID, s.Token = "s1", token.New()
	svc := resources.Slot(configtest.Load(t, nil).Objects(), s, "Pod")
	svc.UID = "slot-uid"
	svc.ResourceVersion = "7"
	svc.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
	return svc
}

func slots(client *fake.Clientset) Slots {
	return Slots{Client: client, Namespace: ns, Remover: &remove.Remover{Client: client, Namespace: ns, Lands: 10 * time.Millisecond},
		UndoTimeout: time.Second}
}

func TestLeftover(t *testing.T) {
	bound := aSlot(t, time.Hour)
	bound.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "sandbox-s1", UID: "pod-uid", Controller: new(bool)}}
	*bound.OwnerReferences[0].Controller = true
	deerflows := aSlot(t, time.Hour)
	delete(deerflows.Spec.Selector, keys.LabelToken)
	tests := []struct {
		name string
		svc  *corev1.Service
		want bool
	}{
		{name: "a slot made a moment ago: its create may still write", svc: aSlot(t, time.Second), want: false},
		{name: "a slot older than any create", svc: aSlot(t, time.Hour), want: true},
		{name: "a bound Service, however old", svc: bound, want: false},
		{name: "DeerFlow's provisioner's Service (no token): never a slot", svc: deerflows, want: false},
	}
	s := slots(fake.NewClientset())
	for _, tc := range tests {
		if got := s.Leftover(tc.svc); got != tc.want {
			t.Errorf("%s: Leftover = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAwait: a wait for another create's slot ends when that create binds
// it or gives it up, and reports false when the slot is still pending as
// the deadline nears.
func TestAwait(t *testing.T) {
	tests := []struct {
		name   string
		change func(client *fake.Clientset, svc *corev1.Service) error
		want   bool
	}{
		{name: "bound by its create", want: true, change: func(client *fake.Clientset, svc *corev1.Service) error {
			b := svc.DeepCopy()
			b.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "sandbox-s1", UID: "pod-uid", Controller: new(bool)}}
			*b.OwnerReferences[0].Controller = true
			_, err := client.CoreV1().Services(ns).Update(context.Background(), b, metav1.UpdateOptions{})
			return err
		}},
		{name: "given up by its create", want: true, change: func(client *fake.Clientset, svc *corev1.Service) error {
			return client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
		}},
		{name: "never answered", want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			svc, err := client.CoreV1().Services(ns).Create(context.Background(), aSlot(t, 0), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.change != nil {
				time.AfterFunc(100*time.Millisecond, func() {
					if err := tc.change(client, svc); err != nil {
						t.Error(err)
					}
				})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			if got := slots(client).Await(ctx, svc, "s1"); got != tc.want {
				t.Errorf("Await = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUndoCut: a slot create that failed without saying whether it was
// written is read back and dropped when it is this create's (its token),
// after the API server's 5xx on the reads and the delete too; a refusal
// wrote nothing, and a Service of another create stays.
func TestUndoCut(t *testing.T) {
	mine := aSlot(t, 0)
	tests := []struct {
		name     string
		stored   *corev1.Service // what the API server holds
		err      error           // the create's failure
		failures int             // 5xx answers before each read and the delete succeed
		want     bool            // the slot is still there
	}{
		{name: "written, the answer lost", stored: mine, err: apierrors.NewInternalError(errors.New("cut")), want: false},
		{name: "written, the answer lost, the API server failing twice more", stored: mine, err: apierrors.NewInternalError(errors.New("cut")), failures: 2, want: false},
		{name: "another create's slot of the id", stored: aSlot(t, 0), err: apierrors.NewInternalError(errors.New("cut")), want: true},
		{name: "refused: nothing to read back", stored: mine, err: apierrors.NewBadRequest("no"), want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.stored.DeepCopy())
			failures := map[string]int{"get": tc.failures, "delete": tc.failures}
			for verb := range failures {
				client.PrependReactor(verb, "services", func(k8stesting.Action) (bool, runtime.Object, error) {
					if failures[verb] > 0 {
						failures[verb]--
						return true, nil, apierrors.NewServiceUnavailable("injected")
					}
					return false, nil, nil
				})
			}
			if err := slots(client).UndoCut(context.Background(), tc.err, mine); err != nil {
				t.Fatal(err)
			}
			_, err := client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "services"}, ns, mine.Name)
			if diff := cmp.Diff(tc.want, err == nil); diff != "" {
				t.Errorf("the slot is still there (-want +got):\n%s (err %v)", diff, err)
			}
		})
	}
}
