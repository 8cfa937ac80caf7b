package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// BaseTemplate is the template E2B's SDK asks for when its caller names
// none (Sandbox.create() with no template).
const BaseTemplate = "base"

// e2bFlags are what E2B needs beside the function (docs/e2b.md): the
// router's manifest and its sandbox policy, where the function's copy of
// the token key goes, and where the client's E2B_SANDBOX_URL is written
// for hack/run.sh to print.
type e2bFlags struct {
	routerManifest, policy, keyFile, clientFile string
}

// check refuses a half-given set: E2B works with all four or none.
func (e e2bFlags) check() error {
	set := 0
	for _, v := range []string{e.routerManifest, e.policy, e.keyFile, e.clientFile} {
		if v != "" {
			set++
		}
	}
	if set != 0 && set != 4 {
		return errors.New("-router-manifest, -router-policy, -e2b-key-file and -e2b-client-file go together")
	}
	return nil
}

// setUp makes E2B's SDK work against the local function and this node, as
// docs/e2b.md tells an operator to: the shared key (the cluster's own if an
// earlier run made one, so its sandboxes' tokens still hold), the router on
// the node, its sandbox policy, and the SDK's default template carrying the
// agent. It adds the function's settings to env.
func (e e2bFlags) setUp(ctx context.Context, client kubernetes.Interface, ns string, env map[string]string) error {
	key, kept, err := tokenKey(ctx, client, ns)
	if err != nil {
		return err
	}
	if err := realnode.DeployRouter(ctx, client, e.routerManifest, ns, key); err != nil {
		return fmt.Errorf("the router did not start: %w", err)
	}
	slog.Info("E2B router Ready", "namespace", ns, "key kept from an earlier run", kept)
	// The function runs as this user (root): only it reads the key.
	if err := os.WriteFile(e.keyFile, key, 0o600); err != nil {
		return fmt.Errorf("writing the function's token key: %w", err)
	}
	if err := applyPolicy(ctx, client, e.policy, ns); err != nil {
		return err
	}
	if err := putBaseTemplate(ctx, client, ns); err != nil {
		return err
	}
	svc, err := client.CoreV1().Services(ns).Get(ctx, realnode.RouterName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the router's Service: %w", err)
	}
	url, err := routerURL(svc)
	if err != nil {
		return err
	}
	// Reachable from this machine: kube-proxy runs on it and translates
	// the ClusterIP to the router's Pods.
	if err := writeAtomic(e.clientFile, []byte("E2B_SANDBOX_URL="+url+"\n")); err != nil {
		return err
	}
	env["SANDBOX_ENVD_IMAGE"] = realnode.EnvdImage
	env["E2B_TOKEN_KEY_FILE"] = e.keyFile
	return nil
}

// tokenKey is the Secret's key when the cluster has a usable one, else a
// fresh one: 48 random bytes, base64 (docs/e2b.md's recipe). kept says
// which.
func tokenKey(ctx context.Context, client kubernetes.Interface, ns string) (key []byte, kept bool, err error) {
	s, err := client.CoreV1().Secrets(ns).Get(ctx, realnode.RouterKeySecret, metav1.GetOptions{})
	switch {
	case err == nil:
		if _, perr := access.ParseKey(s.Data["key"]); perr == nil {
			return s.Data["key"], true, nil
		}
		// Unusable (too short, empty): replaced, as the router would refuse it.
	case !apierrors.IsNotFound(err):
		return nil, false, fmt.Errorf("reading the Secret %s/%s: %w", ns, realnode.RouterKeySecret, err)
	}
	raw := make([]byte, 48)
	if _, err := rand.Read(raw); err != nil {
		return nil, false, err
	}
	return []byte(base64.StdEncoding.EncodeToString(raw)), false, nil
}

// applyPolicy puts the NetworkPolicy of file (config/702) into ns: the
// function does not make it (SANDBOX_NETWORK_POLICY_ENSURE makes the
// shared one alone), and without it the router reaches no sandbox.
func applyPolicy(ctx context.Context, client kubernetes.Interface, file, ns string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("the router's sandbox policy: %w", err)
	}
	var np networkingv1.NetworkPolicy
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&np); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if np.Kind != "NetworkPolicy" || np.Name == "" {
		return fmt.Errorf("%s holds a %q named %q, want a NetworkPolicy", file, np.Kind, np.Name)
	}
	np.Namespace = ns
	nps := client.NetworkingV1().NetworkPolicies(ns)
	live, err := nps.Get(ctx, np.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = nps.Create(ctx, &np, metav1.CreateOptions{})
	case err == nil:
		np.ResourceVersion = live.ResourceVersion
		_, err = nps.Update(ctx, &np, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("the router's sandbox policy %s/%s: %w", ns, np.Name, err)
	}
	return nil
}

// baseTemplate is the SDK's default template on this node: the stand-in
// sandbox with a shell (the SDK runs every command as /bin/bash -l -c),
// carrying the agent. Without DeerFlow's mounts: an E2B client brings no
// DeerFlow thread, and the stand-in's user (1000) could not write the
// thread directory the kubelet makes as root. Its sandboxes pause, as
// every E2B sandbox can (kind ReplicaSet, idle-action pause): pause,
// connect, autoPause and autoResume work on the SDK's default template.
func baseTemplate(ns string) *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: BaseTemplate, Namespace: ns,
			Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false",
				keys.TemplateKind: template.KindReplicaSet, keys.TemplateIdleAction: template.IdlePause,
				// DeerFlow's E2B provider's default template name.
				keys.TemplateAliases: "code-interpreter-v1"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "sandbox", Image: realnode.ShellSandboxImage}},
		}},
	}
}

// putBaseTemplate creates the base template, or puts it back as
// baseTemplate has it: its image is this node's, which an edit could not
// usefully change (nothing else can be pulled here).
func putBaseTemplate(ctx context.Context, client kubernetes.Interface, ns string) error {
	want := baseTemplate(ns)
	pts := client.CoreV1().PodTemplates(ns)
	live, err := pts.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = pts.Create(ctx, want, metav1.CreateOptions{})
	case err == nil:
		want.ResourceVersion = live.ResourceVersion
		_, err = pts.Update(ctx, want, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("the E2B template %s/%s: %w", ns, want.Name, err)
	}
	return nil
}

// routerURL is the router's Service as an E2B_SANDBOX_URL: its ClusterIP,
// and its port unless HTTP's default.
func routerURL(svc *corev1.Service) (string, error) {
	ip := svc.Spec.ClusterIP
	if ip == "" || ip == corev1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
		return "", fmt.Errorf("the router's Service %s/%s has no ClusterIP and port (%q, %d ports)", svc.Namespace, svc.Name, ip, len(svc.Spec.Ports))
	}
	host := ip
	if p := svc.Spec.Ports[0].Port; p != 80 {
		host = net.JoinHostPort(ip, strconv.Itoa(int(p)))
	} else if net.ParseIP(ip).To4() == nil {
		host = "[" + ip + "]"
	}
	return "http://" + host, nil
}

// writeAtomic writes file whole or not at all: hack/run.sh reads it once
// it exists.
func writeAtomic(file string, b []byte) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
